"""The webhook server over real HTTPS on loopback: AdmissionReview JSON in, response and patch out."""

from __future__ import annotations

import base64
import json
import os
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs.rotation import Subject, ensure
from localcluster.cluster import free_port
from shared import keys
from shared.ownership import JobRef
from shared.views import PriorityClassView, QueueView
from webhook.admission import BadReview, parse_review
from webhook.lookup import Lookup
from webhook.server import Metrics, ReloadingTLS, make_app

LOOKUP = Lookup(queues={"q": QueueView.from_obj({"metadata": {"name": "q"}, "spec": {"priorityClassName": "hi"}})},
                priority_classes={"hi": PriorityClassView("hi", 100, False, "PreemptLowerPriority")})


def review(obj: dict, operation: str = "CREATE", kind: str = "Pod", uid: str = "u-1", namespace: str = "ns") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": kind}, "operation": operation,
                        "namespace": namespace, "name": obj.get("metadata", {}).get("name", ""), "object": obj,
                        "dryRun": False}}


POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "p", "namespace": "ns", "annotations": {keys.QUEUE_NAME: "q"}},
       "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    ensure(tmp_path, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))
    return tmp_path


@pytest.fixture
async def server(tls_dir: Path):
    synced = {"podgroups": True, "queues": True}
    metrics = Metrics()
    tls = ReloadingTLS(tls_dir / "tls.crt", tls_dir / "tls.key", metrics)
    runner = web.AppRunner(make_app(lambda: LOOKUP, lambda: dict(synced), metrics))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context).start()
    client_ssl = ssl.create_default_context(cafile=str(tls_dir / "ca-bundle.crt"))
    async with aiohttp.ClientSession(base_url=f"https://127.0.0.1:{port}",
                                     connector=aiohttp.TCPConnector(ssl=client_ssl, force_close=True)) as session:
        yield session, tls, synced
    await runner.cleanup()


async def test_mutate_pod_over_https(server) -> None:
    session, _, _ = server
    async with session.post("/mutate/pods", json=review(POD)) as response:
        assert response.status == 200
        answer = await response.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert {"op": "add", "path": "/spec/priorityClassName", "value": "hi"} in patch


async def test_update_is_not_mutated_and_dry_run_is_answered(server) -> None:
    session, _, _ = server
    async with session.post("/mutate/pods", json=review(POD, operation="UPDATE")) as response:
        assert "patch" not in (await response.json())["response"]
    dry = review(POD)
    dry["request"]["dryRun"] = True
    async with session.post("/mutate/pods", json=dry) as response:
        assert "patch" in (await response.json())["response"]


async def test_denial_names_field_and_fix(server) -> None:
    session, _, _ = server
    queue = {"metadata": {"name": "q1"}, "spec": {"guarantee": {"policy": "Always", "resource": {"cpu": "1"}}}}
    async with session.post("/validate/queues", json=review(queue, kind="Queue", namespace="")) as response:
        answer = (await response.json())["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert "spec.guarantee.policy is 'Always': expected Best-Effort or Guaranteed" in answer["status"]["message"]


@pytest.mark.parametrize("body", [b"not json", b"[]", b"{}", json.dumps({"apiVersion": "v1", "kind": "AdmissionReview"}).encode(),
                                  json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                              "request": {"object": {}}}).encode(),
                                  json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                              "request": {"uid": "x", "object": "str"}}).encode()])
async def test_malformed_bodies_get_400_with_a_message(server, body: bytes) -> None:
    session, _, _ = server
    async with session.post("/mutate/pods", data=body, headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        assert (await response.json())["error"]


async def test_readyz_waits_for_caches_and_metrics_count_requests(server) -> None:
    session, _, synced = server
    async with session.get("/readyz") as response:
        assert response.status == 200
    synced["queues"] = False
    async with session.get("/readyz") as response:
        assert response.status == 503 and "queues" in await response.text()
    await session.post("/mutate/pods", json=review(POD))
    async with session.get("/metrics") as response:
        text = await response.text()
    assert 'reservoir_webhook_requests_total{outcome="patched",route="/mutate/pods"} 1.0' in text
    assert 'reservoir_webhook_cache_synced{cache="queues"} 0.0' in text
    async with session.get("/healthz") as response:
        assert response.status == 200


async def test_certificate_is_reloaded_without_restart(server, tls_dir: Path) -> None:
    session, tls, _ = server

    async def served_serial() -> int:
        import asyncio

        from cryptography import x509
        context = ssl.create_default_context(cafile=str(tls_dir / "ca-bundle.crt"))
        reader, writer = await asyncio.open_connection("127.0.0.1", session._base_url.port, ssl=context)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        await writer.wait_closed()
        return x509.load_der_x509_certificate(der).serial_number

    before = await served_serial()
    (tls_dir / "tls.crt").unlink()
    ensure(tls_dir, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))  # re-issue, same CA
    os.utime(tls_dir / "tls.key")
    assert tls.reload_if_changed()
    after = await served_serial()
    assert after != before
    assert not tls.reload_if_changed()  # nothing changed since


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode()),
                 st.fixed_dictionaries({"apiVersion": st.just("admission.k8s.io/v1"), "kind": st.just("AdmissionReview"),
                                        "request": _json}).map(lambda v: json.dumps(v).encode())))
def test_parser_fuzz_only_raises_bad_review(body: bytes) -> None:
    try:
        parse_review(body)
    except BadReview:
        pass


_pod_like = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({}, optional={"name": st.text(max_size=5), "annotations": st.dictionaries(
        st.sampled_from([keys.GROUP_NAME, keys.QUEUE_NAME, keys.RESERVEABLE, keys.RESERVATION_AFFINITY]), st.text(max_size=12)),
        "ownerReferences": st.lists(st.fixed_dictionaries({"kind": st.sampled_from(["Job", "DaemonSet"]),
                                                           "name": st.text(max_size=4), "controller": st.booleans()}), max_size=2)}),
    "spec": st.fixed_dictionaries({"containers": st.lists(st.fixed_dictionaries({"name": st.just("c")}, optional={
        "resources": st.fixed_dictionaries({}, optional={"requests": st.dictionaries(
            st.sampled_from(["cpu", "memory"]), st.sampled_from(["1", "500m", "1Gi"]))})}), max_size=2)},
        optional={"tolerations": st.lists(st.fixed_dictionaries({"key": st.text(max_size=3)}), max_size=2),
                  "priorityClassName": st.sampled_from(["", "hi", "other"])}),
})


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(_pod_like)
async def test_mutate_route_fuzz_never_500(server, pod: dict) -> None:
    session, _, _ = server
    async with session.post("/mutate/pods", json=review(pod)) as response:
        assert response.status == 200, await response.text()


# --- issue 10: UPDATE judged by what it changes; malformed objects answered 400 ---

BAD_POD = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ns", "finalizers": ["example.com/keep"],
                        "annotations": {keys.MAXIMUM_RUNTIME: "forever"}}, "spec": {"containers": [{"name": "c"}]}}


def update(obj: dict, old: dict, kind: str = "Pod") -> dict:
    body = review(obj, operation="UPDATE", kind=kind)
    body["request"]["oldObject"] = old
    return body


async def test_pod_admitted_while_the_webhook_was_down_can_drop_its_finalizers(server) -> None:
    session, _, _ = server
    async with session.post("/validate/pods", json=review(BAD_POD)) as response:
        assert (await response.json())["response"]["allowed"] is False, "on CREATE it is refused"
    released = {**BAD_POD, "metadata": {**BAD_POD["metadata"], "finalizers": []}}
    async with session.post("/validate/pods", json=update(released, BAD_POD)) as response:
        answer = (await response.json())["response"]
    assert answer["allowed"] is True
    assert "maximum-runtime" in answer["warnings"][0] and "this update does not change it" in answer["warnings"][0]


async def test_pod_update_that_writes_a_new_bad_value_is_refused(server) -> None:
    session, _, _ = server
    changed = {**BAD_POD, "metadata": {**BAD_POD["metadata"], "annotations": {keys.MAXIMUM_RUNTIME: "9 years"}}}
    async with session.post("/validate/pods", json=update(changed, BAD_POD)) as response:
        answer = (await response.json())["response"]
    assert answer["allowed"] is False and "'9 years'" in answer["status"]["message"]


@pytest.mark.parametrize(("path", "obj", "field"), [
    ("/mutate/pods", {"metadata": {"ownerReferences": 5}}, "request.object.metadata.ownerReferences"),
    ("/validate/pods", {"metadata": {"annotations": 7}}, "request.object.metadata.annotations"),
    ("/mutate/pods", {"spec": {"tolerations": {"key": "x"}}}, "request.object.spec.tolerations"),
    ("/validate/podgroups", {"spec": {"queue": ["q"]}}, "request.object.spec.queue"),
])
async def test_wrong_types_are_a_400_naming_the_field_never_a_500(server, path: str, obj: dict, field: str) -> None:
    session, _, _ = server
    async with session.post(path, json=review(obj)) as response:
        assert response.status == 400
        assert (await response.json())["error"].startswith(f"{field} must be ")


async def test_pod_locks_refuses_what_the_pod_is_not_entitled_to(server) -> None:
    """Issue 10, attack 3: a pod that brings a lock toleration of another owner, a blanket one, or a nodeName on a
    node locked for another owner is refused with the reason; its own job's toleration passes."""
    session, _, _ = server
    own = {"key": keys.LOCK, "operator": "Equal", "value": JobRef("ns", "Pod", "p").owner_id, "effect": "NoSchedule"}
    forged = {"key": keys.LOCK, "operator": "Equal", "value": "job-team-b-Pod-big-abc123", "effect": "NoSchedule"}
    cases = [([own], True, ""), ([forged], False, "job-team-b-Pod-big-abc123"),
             ([{"operator": "Exists"}], False, "every Reservoir lock"),
             ([{"key": keys.LOCK, "operator": "Exists"}], False, "every Reservoir lock")]
    for tolerations, allowed, says in cases:
        obj = json.loads(json.dumps(POD))
        obj["spec"]["tolerations"] = tolerations
        async with session.post("/validate/pod-locks", json=review(obj)) as response:
            answer = (await response.json())["response"]
        assert answer["allowed"] is allowed, (tolerations, answer)
        if not allowed:
            assert answer["status"]["code"] == 403 and says in answer["status"]["message"]
            assert "spec.tolerations[0]" in answer["status"]["message"]
    # an UPDATE that leaves tolerations and nodeName as they were is not judged again
    obj = json.loads(json.dumps(POD))
    obj["spec"]["tolerations"] = [forged]
    changed = review(obj, operation="UPDATE")
    changed["request"]["oldObject"] = obj
    async with session.post("/validate/pod-locks", json=changed) as response:
        assert (await response.json())["response"]["allowed"] is True


async def test_a_pod_update_is_judged_for_what_it_adds_not_for_what_the_pod_already_carried(server) -> None:
    """A pod admitted with its job's toleration whose rights changed since (its job is read another way now, its
    queue's binding moved, a window ended) may still take an update that adds a toleration of no lock (Kueue adding
    its flavor's when it admits the pod), and the index named in a refusal is the new object's; an update adding a
    lock toleration the pod may not use, or moving it onto a locked node, is refused as before."""
    session, _, _ = server
    stale = {"key": keys.LOCK, "operator": "Equal", "value": "job-ns-Pod-old-name-abc123", "effect": "NoSchedule"}
    flavor = {"key": "flavor", "operator": "Exists", "effect": "NoSchedule"}
    forged = {"key": keys.LOCK, "operator": "Equal", "value": "job-team-b-Pod-big-abc123", "effect": "NoSchedule"}
    old = json.loads(json.dumps(POD))
    old["spec"]["tolerations"] = [stale]
    for added, allowed in (([flavor], True), ([flavor, forged], False)):
        new = json.loads(json.dumps(old))
        new["spec"]["tolerations"] = [stale, *added]
        request = review(new, operation="UPDATE")
        request["request"]["oldObject"] = old
        async with session.post("/validate/pod-locks", json=request) as response:
            answer = (await response.json())["response"]
        assert answer["allowed"] is allowed, (added, answer)
        if not allowed:
            message = answer["status"]["message"]
            assert "spec.tolerations[2]" in message and "job-team-b-Pod-big-abc123" in message, message
            assert "old-name" not in message, "what the pod carried before is not judged again"
    # the same stale toleration brought in a CREATE is refused
    async with session.post("/validate/pod-locks", json=review(old)) as response:
        assert (await response.json())["response"]["allowed"] is False
