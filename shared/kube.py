"""The Kubernetes client edge: building an ApiClient, the JSON requests Reservoir sends, and the API's status codes
turned into error classes once.

Every request goes through `send_json` (or `get_stream` for a watch), which raises on any answer outside 2xx: a
404, 409, 410, 422 or 429 as the class below that names it, anything else as a plain `ApiException`. The classes
subclass `ApiException`, so a handler of any API error still catches them, with the same `status` and `reason`.
Every request has a timeout (REQUEST_TIMEOUT unless the caller gives one): no answer in time raises TimeoutError.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

Query = Sequence[tuple[str, Any]]
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# Every request has a deadline: a call the API server does not answer in time raises TimeoutError, never hangs.
# send_json / get_json use this unless told otherwise (a list passes its own, a watch its own).
REQUEST_TIMEOUT = 10.0


class NotFound(ApiException):
    """404: the object is gone, or the API (a CRD) is not installed."""


class Conflict(ApiException):
    """409: a concurrent write changed the object first."""


class Gone(ApiException):
    """410: a watch's resourceVersion is too old; list again."""


class Invalid(ApiException):
    """422: the request was refused as invalid. A JSON Patch whose `test` operation failed answers this too, so for a
    patch guarded by a `test` of `metadata.resourceVersion` it means a concurrent write, as 409 does."""


class Throttled(ApiException):
    """429: too many requests, or an eviction a PodDisruptionBudget forbids at the moment."""


_BY_STATUS: dict[int, type[ApiException]] = {404: NotFound, 409: Conflict, 410: Gone, 422: Invalid, 429: Throttled}


def api_error(status: int, reason: str | None = None, body: bytes | None = None) -> ApiException:
    """The error for an answer with HTTP `status`: the class naming it, else a plain ApiException."""
    error = _BY_STATUS.get(status, ApiException)(status=status, reason=reason)
    error.body = body
    return error


def resource_path(api_version: str, plural: str, name: str | None = None, namespace: str | None = None,
                  subresource: str | None = None) -> str:
    """The REST path of a collection or object: `v1` is the core group (`/api/v1`), anything else `/apis/<gv>`."""
    parts = ["/api/v1" if api_version == "v1" else f"/apis/{api_version}"]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


async def _send(api: client.ApiClient, method: str, path: str, *, body: Any = None, content_type: str = JSON,
                query: Query = (), timeout: float | None = None) -> aiohttp.ClientResponse:
    """One request, its raw response; raises `api_error` for an answer outside 2xx (the client does not check the
    status itself when it is asked for the raw response)."""
    result = await api.call_api(
        path, method, query_params=list(query), header_params={"Accept": JSON, "Content-Type": content_type},
        body=body, auth_settings=["BearerToken"], _preload_content=False, response_types_map={},
        _request_timeout=timeout,
    )
    response: aiohttp.ClientResponse = result[0] if isinstance(result, tuple) else result
    if not 200 <= response.status <= 299:
        try:
            data = await response.read()
        finally:
            response.release()
        raise api_error(response.status, response.reason, data)
    return response


async def send_json(api: client.ApiClient, method: str, path: str, body: Any = None, *, content_type: str = JSON,
                    query: Query = (), timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    """Send `body` (JSON) with `method` to `path`; the answer's JSON object ({} when it has no body). The whole
    exchange, answer read included, must end within `timeout` seconds (TimeoutError)."""
    response = await _send(api, method, path, body=body, content_type=content_type, query=query, timeout=timeout)
    try:
        raw = await response.read()
    finally:
        response.release()
    if not raw.strip():
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{method} {path} answered with a JSON {type(data).__name__}, not an object: {raw[:300]!r}")
    return data


async def get_json(api: client.ApiClient, path: str, query: Query = (),
                   timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    """GET `path`: the object or list, as JSON (within `timeout` seconds)."""
    return await send_json(api, "GET", path, query=query, timeout=timeout)


async def get_stream(api: client.ApiClient, path: str, query: Query = (),
                     timeout: float | None = None) -> aiohttp.ClientResponse:
    """GET `path` and hand back the open response, for a watch read line by line; the caller releases it."""
    return await _send(api, "GET", path, query=query, timeout=timeout)


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace(fallback: str, path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace this process runs in: the in-cluster service account's namespace file, else `fallback` (outside
    a cluster, or when the file is unreadable or empty)."""
    try:
        return path.read_text().strip() or fallback
    except OSError:
        return fallback


class KubeconfigError(Exception):
    """No usable kubeconfig: none found where kubectl looks, a file that is not one, or a context it does not define.
    The message is one line and names the places or files concerned."""


# Inside a kubeconfig, the fields naming a file: kubectl resolves a relative one against the directory of the file
# that defines it (clientcmd ResolveLocalPaths), and so does Reservoir, before the files are merged.
_CLUSTER_FILES = ("certificate-authority",)
_USER_FILES = ("client-certificate", "client-key", "tokenFile")
_NAMED_LISTS = ("clusters", "contexts", "users")


@dataclass(frozen=True)
class Kubeconfig:
    """Where the client's configuration comes from: the merged kubeconfig `config` and the `context` chosen in it,
    or, when `config` is None, the in-cluster service account. `files` are the kubeconfig files read, in order;
    `tried` every place looked at, for an error message."""

    config: dict[str, Any] | None
    context: str | None
    files: tuple[Path, ...] = ()
    tried: tuple[str, ...] = ()


def kubeconfig_files(explicit: str | Path | None, environ: Mapping[str, str], home: Path) -> tuple[list[Path], str]:
    """The kubeconfig files to merge, as kubectl chooses them, and a description of where it looked:
    `--kubeconfig` alone when given (it must exist); else every file `$KUBECONFIG` lists (separated by os.pathsep,
    duplicates and missing files skipped); else `~/.kube/config` when it exists."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise KubeconfigError(f"--kubeconfig {path}: no such file")
        return [path], f"--kubeconfig {path}"
    listed = environ.get("KUBECONFIG", "")
    if listed:
        seen: list[Path] = []
        for part in listed.split(os.pathsep):
            if part and Path(part) not in seen:
                seen.append(Path(part))
        return [p for p in seen if p.is_file()], f"$KUBECONFIG={listed}"
    default = home / ".kube" / "config"
    return ([default] if default.is_file() else []), str(default)


def _absolute(entry: Any, fields: tuple[str, ...], base: Path) -> Any:
    if not isinstance(entry, dict):
        return entry
    out = dict(entry)
    for name in fields:
        value = out.get(name)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            out[name] = str(base / value)
    return out


def _resolve_paths(item: str, entry: dict[str, Any], base: Path) -> dict[str, Any]:
    """One clusters/contexts/users entry with its relative file references made absolute against `base`."""
    out = dict(entry)
    if item == "clusters":
        out["cluster"] = _absolute(entry.get("cluster"), _CLUSTER_FILES, base)
    elif item == "users":
        user = _absolute(entry.get("user"), _USER_FILES, base)
        exec_ = user.get("exec") if isinstance(user, dict) else None
        # an exec command is a path only when it names a directory (kubectl: otherwise it is looked up in PATH)
        if isinstance(exec_, dict) and isinstance(exec_.get("command"), str) and os.sep in exec_["command"]:
            user = {**user, "exec": _absolute(exec_, ("command",), base)}
        out["user"] = user
    return out


def merge_kubeconfigs(files: Sequence[Path]) -> dict[str, Any]:
    """The files merged as kubectl merges them: the first file that sets a value wins. A cluster, context or user
    is taken whole from the first file defining its name; `current-context` from the first file setting it. Relative
    file references are resolved against their own file's directory first. `preferences` and `extensions` are
    ignored (kubernetes_asyncio reads neither)."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []}
    for path in files:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise KubeconfigError(f"{path}: {' '.join(str(err).split())}") from err
        if data is None:
            continue
        if not isinstance(data, dict):
            raise KubeconfigError(f"{path}: not a kubeconfig (a YAML {type(data).__name__}, not a mapping)")
        base = path.absolute().parent
        for item in _NAMED_LISTS:
            entries = data.get(item) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"{path}: {item} is not a list")
            names = {e["name"] for e in merged[item]}
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise KubeconfigError(f"{path}: an entry of {item} has no name")
                if entry["name"] not in names:
                    merged[item].append(_resolve_paths(item, entry, base))
                    names.add(entry["name"])
        if not merged.get("current-context") and data.get("current-context"):
            merged["current-context"] = data["current-context"]
    return merged


def _empty(config: dict[str, Any]) -> bool:
    return not (config.get("current-context") or any(config.get(item) for item in _NAMED_LISTS))


def resolve_kubeconfig(kubeconfig: str | Path | None = None, context: str | None = None,
                       environ: Mapping[str, str] | None = None, home: Path | None = None) -> Kubeconfig:
    """Where to connect, as kubectl decides it: `--kubeconfig`, else `$KUBECONFIG`'s files merged, else
    `~/.kube/config`; when that yields no configuration at all, the in-cluster service account (when
    KUBERNETES_SERVICE_HOST is set); else KubeconfigError naming every place tried. `context` (`--context`) picks a
    context instead of the merged `current-context`."""
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else home
    files, where = kubeconfig_files(kubeconfig, environ, home)
    merged = merge_kubeconfigs(files)
    tried = (where if files else f"{where} (no file)",)
    if _empty(merged):
        if environ.get("KUBERNETES_SERVICE_HOST"):
            return Kubeconfig(None, None, tuple(files), (*tried, "in-cluster"))
        raise KubeconfigError("no kubeconfig found: tried " + ", ".join(
            (*tried, "in-cluster (KUBERNETES_SERVICE_HOST is not set)")))
    shown = ", ".join(str(f) for f in files)
    name = context or merged.get("current-context")
    if not name:
        contexts = ", ".join(c["name"] for c in merged["contexts"]) or "none"
        raise KubeconfigError(f"no current-context in {shown}: pass --context (contexts: {contexts})")
    chosen = next((c for c in merged["contexts"] if c["name"] == name), None)
    if chosen is None:
        raise KubeconfigError(f'context "{name}" not found in {shown}')
    cluster = (chosen.get("context") or {}).get("cluster")
    if not any(c["name"] == cluster for c in merged["clusters"]):
        raise KubeconfigError(f'context "{name}" names cluster "{cluster}", which {shown} does not define')
    return Kubeconfig(merged, str(name), tuple(files), tried)


async def new_api_client(kubeconfig: str | Path | None = None, impersonate: str | None = None, *,
                         context: str | None = None) -> client.ApiClient:
    """An ApiClient configured as kubectl would be (resolve_kubeconfig): `kubeconfig` (`--kubeconfig`), else
    $KUBECONFIG (a list, merged), else ~/.kube/config, else the in-cluster service account; `context` as
    `--context`. KubeconfigError when none of them gives a configuration.

    `impersonate` (a user name such as `system:serviceaccount:ns:name`) sends Impersonate-User, so a test can
    run a component with exactly the permissions its ServiceAccount has.
    """
    resolved = resolve_kubeconfig(kubeconfig, context)
    configuration = client.Configuration()
    try:
        if resolved.config is not None:
            await config.load_kube_config_from_dict(resolved.config, context=resolved.context,
                                                    client_configuration=configuration)
        else:
            # kubernetes_asyncio ships no annotations for load_incluster_config (its other config loaders have them)
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as err:
        where = ", ".join(str(f) for f in resolved.files) or "in-cluster"
        raise KubeconfigError(f"{where}: {' '.join(str(err).split())}") from err
    api = client.ApiClient(configuration=configuration)
    if impersonate:
        api.set_default_header("Impersonate-User", impersonate)
    return api
