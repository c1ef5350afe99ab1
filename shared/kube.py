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
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
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


async def new_api_client(kubeconfig: str | Path | None = None, impersonate: str | None = None) -> client.ApiClient:
    """An ApiClient for `kubeconfig`, else $KUBECONFIG, else the in-cluster service account.

    `impersonate` (a user name such as `system:serviceaccount:ns:name`) sends Impersonate-User, so a test can
    run a component with exactly the permissions its ServiceAccount has.
    """
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    else:
        # kubernetes_asyncio ships no annotations for load_incluster_config (its other config loaders have them)
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = client.ApiClient(configuration=configuration)
    if impersonate:
        api.set_default_header("Impersonate-User", impersonate)
    return api
