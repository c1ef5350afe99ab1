"""What end-to-end tests do against the local control plane: kwok nodes, pods, waits, custom objects."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from localcluster.cluster import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, LocalCluster, kwok_node
from localcluster.webhook_process import WebhookProcess
from shared.kube import new_api_client

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class Refused(Exception):
    """The API server refused a request the test expected to succeed: names the call, the code and its message."""

    def __init__(self, method: str, path: str, status: int, answer: Any) -> None:
        message = answer.get("message") if isinstance(answer, dict) else answer
        super().__init__(f"{method} {path} refused with {status}: {message}")
        self.status = status
        self.answer = answer


class Kit:
    """One test's handle on the cluster: its own namespace, the nodes it made, cleanup on close."""

    def __init__(self, cluster: LocalCluster, api: client.ApiClient, namespace: str) -> None:
        self.cluster = cluster
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.extensions = client.ApiextensionsV1Api(api)
        self.namespace = namespace
        self.nodes: list[str] = []

    @classmethod
    async def open(cls, cluster: LocalCluster, test_name: str) -> Kit:
        api = await new_api_client(cluster.kubeconfig)
        slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
        namespace = f"{slug}-{uuid.uuid4().hex[:5]}"
        kit = cls(api=api, cluster=cluster, namespace=namespace)
        await kit.delete_all_kwok_nodes()
        await kit.core.create_namespace({"metadata": {"name": namespace}})
        await kit.wait_for(lambda: kit._service_account_exists(), what=f"default ServiceAccount in {namespace}")
        return kit

    async def close(self) -> None:
        try:
            # pods first, at once: a pending pod left behind would look like a starving job to the next test's agent
            await self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
            await self.delete_all_kwok_nodes()
            await self.core.delete_namespace(self.namespace)
        finally:
            await self.api.close()

    async def _service_account_exists(self) -> bool:
        try:
            await self.core.read_namespaced_service_account("default", self.namespace)
            return True
        except ApiException as err:
            if err.status == 404:
                return False
            raise

    # --- waiting ---

    async def wait_for(
        self, probe: Callable[[], Awaitable[T]], *, what: str, timeout: float = 60.0, interval: float = 0.25
    ) -> T:
        """Poll `probe` until it returns something truthy; fail naming `what` and the last value seen."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = await probe()
            if last:
                return last
            self.cluster.check_alive()
            await asyncio.sleep(interval)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")

    # --- nodes ---

    async def create_node(
        self, name: str, allocatable: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """A kwok node with the given allocatable; waits until kwok has made it Ready."""
        body = kwok_node(name, dict(allocatable), dict(labels or {}))
        await self.core.create_node(body)
        self.nodes.append(name)
        return await self.wait_for(lambda: self._ready_node(name), what=f"node {name} Ready")

    async def _ready_node(self, name: str) -> dict[str, Any] | None:
        node = await self.read_node(name)
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return node if ready else None

    async def read_node(self, name: str) -> dict[str, Any]:
        return await self.raw("GET", f"/api/v1/nodes/{name}")

    async def delete_all_kwok_nodes(self) -> None:
        nodes = await self.raw("GET", "/api/v1/nodes")
        for node in nodes.get("items", []):
            annotations = node["metadata"].get("annotations") or {}
            if annotations.get(KWOK_NODE_ANNOTATION) == KWOK_NODE_VALUE:
                try:
                    await self.core.delete_node(node["metadata"]["name"])
                except ApiException as err:
                    if err.status != 404:
                        raise

    async def patch_node(self, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.raw("PATCH", f"/api/v1/nodes/{name}", body=patch,
                              content_type="application/json-patch+json")

    # --- pods ---

    def pod_body(
        self,
        name: str,
        requests: Mapping[str, str] | None = None,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        extra_spec: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "registry.invalid/reservoir-test:1"}
        if requests:
            container["resources"] = {"requests": dict(requests)}
        spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0}
        if tolerations:
            spec["tolerations"] = tolerations
        spec.update(extra_spec or {})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": spec,
        }

    async def create_pod(self, name: str, requests: Mapping[str, str] | None = None, **kw: Any) -> dict[str, Any]:
        return await self.raw("POST", f"/api/v1/namespaces/{self.namespace}/pods", body=self.pod_body(name, requests, **kw))

    async def read_pod(self, name: str) -> dict[str, Any]:
        return await self.raw("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    async def wait_pod(self, name: str, predicate: Callable[[dict[str, Any]], bool], what: str,
                       timeout: float = 60.0) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            pod = await self.read_pod(name)
            return pod if predicate(pod) else None
        return await self.wait_for(probe, what=f"pod {name} {what}", timeout=timeout)

    # --- raw API access (JSON in, JSON out) ---

    async def raw(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """Call the API with a JSON body and return the decoded JSON response. A refusal raises `Refused` with the
        server's message, so a test never goes on past a create or patch that did not happen; a DELETE of what is
        already gone (404) is what the caller asked for and returns the Status. A test that expects a refusal asks
        with `attempt`."""
        status, answer = await self._call(method, path, body, content_type)
        if status >= 400 and not (method == "DELETE" and status == 404):
            raise Refused(method, path, status, answer)
        return answer

    async def attempt(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """As `raw`, but a refusal is returned as the server's Status object instead of raised: for the tests whose
        subject is the refusal (a webhook's denial, RBAC's 403, a 404 once something is gone)."""
        return (await self._call(method, path, body, content_type))[1]

    async def _call(self, method: str, path: str, body: Any, content_type: str) -> tuple[int, Any]:
        response = await self.api.call_api(
            path, method, body=body, header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, response_types_map={},
        )
        raw = response[0] if isinstance(response, tuple) else response
        data = await raw.read()
        return raw.status, (yaml.safe_load(data) if data else None)

    async def apply_manifest_file(self, path: Path) -> list[dict[str, Any]]:
        """Create every object in a YAML file (CRDs, RBAC, ...) with server-side apply."""
        out = []
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") == "Kustomization":
                continue
            out.append(await self.server_side_apply(doc))
        return out

    async def server_side_apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self.raw("PATCH", object_path(obj) + "?fieldManager=reservoir-tests&force=true",
                              body=obj, content_type="application/apply-patch+yaml")


_CORE_PLURALS = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings", "Node": "nodes", "Pod": "pods", "Namespace": "namespaces", "ConfigMap": "configmaps",
                 "ServiceAccount": "serviceaccounts", "Secret": "secrets", "Service": "services"}


def object_path(obj: Mapping[str, Any]) -> str:
    """The REST path of an object (only the kinds tests apply)."""
    api_version = obj["apiVersion"]
    kind = obj["kind"]
    meta = obj["metadata"]
    plural = _CORE_PLURALS.get(kind) or kind.lower() + ("es" if kind.endswith("s") else "s")
    if kind == "CustomResourceDefinition":
        plural = "customresourcedefinitions"
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    namespace = meta.get("namespace")
    middle = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{middle}/{plural}/{meta['name']}"


@asynccontextmanager
async def running_webhook(kit: Kit) -> AsyncIterator[WebhookProcess]:
    """`reservoir webhook` running as its ServiceAccount and registered through the real webhook
    configurations; unregistered and stopped on exit."""
    process = WebhookProcess(kit.cluster)
    process.start()
    process.register(kit.cluster.kubectl)
    try:
        yield process
    finally:
        WebhookProcess.unregister(kit.cluster.kubectl)
        process.stop()


async def apply_setup(kit: Kit, *files: str) -> None:
    """Apply repository manifests (CRDs, namespace, RBAC) and wait for the CRDs to be Established."""
    for name in files:
        for obj in await kit.apply_manifest_file(REPO / name):
            if obj and obj.get("kind") == "CustomResourceDefinition":
                crd = obj["metadata"]["name"]

                async def established(crd: str = crd) -> bool:
                    got = await kit.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
                    return any(c["type"] == "Established" and c["status"] == "True"
                               for c in (got.get("status") or {}).get("conditions") or [])
                await kit.wait_for(established, what=f"CRD {crd} Established")
