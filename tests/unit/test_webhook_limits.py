"""The webhook server's limits over real HTTPS on loopback (issue 10): 413 over 3 MiB (declared or chunked), 400
with a one-line reason for anything malformed, an answer within the request's timeout, bounded keep-alive and
headers; and a few hundred fuzz cases from `make fuzz-webhook`."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from certs.rotation import Subject, ensure
from localcluster.cluster import free_port
from shared import keys
from shared.quantity import QuantityError
from shared.views import NodeView
from webhook import admission, server
from webhook.lookup import Lookup
from webhook.server import Endpoint, Metrics, ReloadingTLS, make_app, make_runner

LOOKUP = Lookup(nodes={"n": NodeView.from_obj({"metadata": {"name": "n"},
                                               "status": {"allocatable": {"cpu": "4", "memory": "16Gi"}}})})
MIB = 1024 * 1024


def review(obj: object, operation: str = "CREATE", kind: str = "Pod", old: object = None) -> dict:
    request = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind}, "operation": operation,
               "namespace": "ns", "name": "x", "object": obj}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


POD = {"metadata": {"name": "p", "namespace": "ns", "annotations": {keys.QUEUE_NAME: "q"}},
       "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}


class Server:
    def __init__(self, port: int, ca: Path) -> None:
        self.port, self.ca = port, ca
        self.context = ssl.create_default_context(cafile=str(ca))

    def session(self, **connector: object) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(f"https://127.0.0.1:{self.port}",
                                     connector=aiohttp.TCPConnector(ssl=self.context, **connector))

    async def post(self, path: str, body: object, timeout: str = "2s") -> tuple[int, dict]:
        data = body if isinstance(body, bytes) or hasattr(body, "__aiter__") else json.dumps(body).encode()
        async with self.session() as session, session.post(
                f"{path}?timeout={timeout}", data=data, headers={"Content-Type": "application/json"}) as response:
            text = await response.text()
            return response.status, json.loads(text)

    async def raw(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.context)


async def _serve(tls_dir: Path) -> AsyncIterator[Server]:
    tls = ReloadingTLS(tls_dir / "tls.crt", tls_dir / "tls.key")
    runner = make_runner(make_app(lambda: LOOKUP, lambda: {"all": True}, Metrics()))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context).start()
    try:
        yield Server(port, tls_dir / "ca-bundle.crt")
    finally:
        await runner.cleanup()


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    ensure(tmp_path, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))
    return tmp_path


@pytest.fixture
async def https(tls_dir: Path) -> AsyncIterator[Server]:
    async for served in _serve(tls_dir):
        yield served


# --- bodies over 3 MiB ---

async def test_body_over_3_mib_is_refused_413_with_one_line(https: Server) -> None:
    status, answer = await https.post("/mutate/pods", b" " * (3 * MIB + 1))
    assert status == 413
    assert answer["error"] == ("request body of 3145729 bytes is over the limit of 3145728 bytes (3 MiB, the API "
                               "server's own)")
    await asyncio.sleep(0.1)  # the server drops the rest of the body (LINGERING_TIME): let it see the client go


async def test_chunked_body_over_3_mib_is_refused_413(https: Server) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b" " * 100_000

    status, answer = await https.post("/validate/queues", chunks())
    assert status == 413 and "over the limit of 3145728 bytes" in answer["error"] and "\n" not in answer["error"]
    await asyncio.sleep(0.1)


async def test_body_just_under_3_mib_is_answered(https: Server) -> None:
    body = review({**POD, "spec": {**POD["spec"], "pad": "x" * (3 * MIB - 2000)}})
    status, answer = await https.post("/mutate/pods", body)
    assert status == 200 and answer["response"]["allowed"] is True

    async def chunks() -> AsyncIterator[bytes]:
        encoded = json.dumps(body).encode()
        for start in range(0, len(encoded), 500_000):
            yield encoded[start:start + 500_000]

    status, answer = await https.post("/validate/pods", chunks())
    assert status == 200 and answer["response"]["uid"] == "u-1"


# --- malformed requests: 400, one line, never 500 ---

NOT_AN_OBJECT = [
    ("/mutate/pods", {"metadata": []}, "request.object.metadata must be an object, not a list"),
    ("/mutate/pods", {"metadata": {"annotations": 5}}, "request.object.metadata.annotations must be an object, not "
                                                       "a number"),
    ("/validate/pods", {"metadata": {"labels": {"a": 1}}}, 'request.object.metadata.labels["a"] must be a string'),
    ("/mutate/pods", {"spec": {"tolerations": {"key": "x"}}}, "request.object.spec.tolerations must be a list, not "
                                                              "an object"),
    ("/mutate/pods", {"spec": {"tolerations": ["x"]}}, "request.object.spec.tolerations[0] must be an object"),
    ("/mutate/pods", {"spec": {"containers": [{"resources": {"requests": ["cpu"]}}]}},
     "request.object.spec.containers[0].resources.requests must be an object, not a list"),
    ("/mutate/pods", {"spec": {"containers": [{"resources": {"limits": {"cpu": 0.5}}}]}},
     'request.object.spec.containers[0].resources.limits["cpu"] must be a quantity'),
    ("/mutate/pods", {"metadata": {"ownerReferences": [{"kind": "DaemonSet", "controller": "yes"}]}},
     "request.object.metadata.ownerReferences[0].controller must be a boolean, not a string"),
    ("/mutate/pods", {"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": {}}}}},
     "preferredDuringSchedulingIgnoredDuringExecution must be a list"),
    ("/mutate/podgroups", {"spec": {"queue": {"name": "q"}}}, "request.object.spec.queue must be a string"),
    ("/validate/podgroups", {"spec": []}, "request.object.spec must be an object, not a list"),
    ("/validate/queues", {"spec": "x"}, "request.object.spec must be an object, not a string"),
    ("/validate/reservations", {"metadata": {"name": ["r"]}}, "request.object.metadata.name must be a string"),
    ("/validate/configmaps", {"metadata": {"name": keys.CONFIGMAP_NAME}, "data": {keys.CONFIG_KEY: 5}},
     'request.object.data["config.yaml"] must be a string, not a number'),
]


@pytest.mark.parametrize(("path", "obj", "reason"), NOT_AN_OBJECT)
async def test_wrong_types_in_the_object_get_400_naming_the_field(https: Server, path: str, obj: dict,
                                                                  reason: str) -> None:
    status, answer = await https.post(path, review(obj))
    assert status == 400 and reason in answer["error"], answer
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]


async def test_wrong_types_in_the_old_object_get_400(https: Server) -> None:
    status, answer = await https.post("/validate/pods", review(POD, "UPDATE", old={"metadata": {"annotations": []}}))
    assert status == 400 and answer["error"].startswith("request.oldObject.metadata.annotations must be an object")


RAW = [
    (b"\xff\xfe\xfd not utf-8", "request body is not JSON"),
    ('{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "\xe9"}}'.encode("latin-1"),
     "request body is not JSON"),
    (b'{"apiVersion": NaN}', "request body is not JSON: NaN is not JSON"),
    (b'{"a": ' * 100_000, "nests deeper than about 1000 levels"),
    (b"[" * 1_000_000, "nests deeper than about 1000 levels"),
    (b'{"a": ' + b"9" * 10_000 + b"}", "request body is not JSON"),
    (b"", "request body is not JSON"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "uid": 5}}).encode(), "request.uid is missing"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "uid": "u" * 300}}).encode(),
     "request.uid is 300 characters long"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "operation": "PATCH"}}).encode(),
     "request.operation is 'PATCH': expected one of CREATE, UPDATE, DELETE, CONNECT"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "kind": "Pod"}}).encode(),
     "request.kind must be an object, not a string"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "namespace": ["ns"]}}).encode(),
     "request.namespace must be a string, not a list"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "dryRun": "yes"}}).encode(),
     "request.dryRun must be a boolean"),
    (json.dumps({**review(POD), "request": {**review(POD)["request"], "oldObject": [1]}}).encode(),
     "request.oldObject must be an object, not a list"),
]


@pytest.mark.parametrize(("body", "reason"), RAW)
async def test_unreadable_bodies_get_400_with_a_one_line_reason_on_every_route(https: Server, body: bytes,
                                                                                reason: str) -> None:
    async with https.session(limit=1) as session:
        for path in sorted(server.ROUTES):
            async with session.post(f"{path}?timeout=2s", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                answer = await response.json()
            assert response.status == 400 and reason in answer["error"], (path, answer)
            assert "\n" not in answer["error"] and len(answer["error"]) < 2200


async def test_deep_nesting_where_the_webhook_does_not_read_is_fine(https: Server) -> None:
    deep: object = None
    for _ in range(900):
        deep = [deep]
    body = json.dumps(review({**POD, "spec": {**POD["spec"], "extra": 0}})).replace('"extra": 0', '"extra": '
                                                                                     + "[" * 900 + "]" * 900)
    status, _ = await https.post("/mutate/pods", body.encode())
    assert status == 200


async def test_a_denial_quoting_a_huge_value_stays_short(https: Server) -> None:
    pod = {"metadata": {"name": "p", "annotations": {keys.RESERVEABLE: "y" * 1_000_000}}, "spec": {}}
    status, answer = await https.post("/validate/pods", review(pod))
    assert status == 200 and answer["response"]["allowed"] is False
    assert len(answer["response"]["status"]["message"]) < 500


def test_a_parser_error_met_by_a_route_is_a_400_naming_the_field() -> None:
    def route(request: admission.Request, lookup: Lookup) -> admission.ReviewResponse:
        raise QuantityError("quantity 'x' is not valid")

    endpoint = Endpoint(route, admission.POD, mutating=True)
    pod = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "x"}}}]}}
    answer = server._answer("/mutate/pods", endpoint, json.dumps(review(pod)).encode(), lambda: LOOKUP,
                            server._Progress())
    assert answer.status == 400 and answer.body["error"].startswith(
        'request.object.spec.containers[0].resources.limits["cpu"]: quantity \'x\' is not valid')


def test_text_that_is_not_unicode_met_by_a_route_is_a_400() -> None:
    def route(request: admission.Request, lookup: Lookup) -> admission.ReviewResponse:
        request.obj["metadata"]["name"].encode()
        return admission.response(request.uid)

    answer = server._answer("/mutate/pods", Endpoint(route, admission.POD), json.dumps(review(
        {"metadata": {"name": "\ud800"}})).encode(), lambda: LOOKUP, server._Progress())
    assert answer.status == 400 and "not valid Unicode" in answer.body["error"]


# --- the deadline: `?timeout=` ---

@pytest.mark.parametrize(("query", "expected"), [
    (None, (2.0, 1.8)), ("2s", (2.0, 1.8)), ("10s", (10.0, 9.8)), ("1s", (1.0, 0.9)), ("500ms", (0.5, 0.45)),
    ("banana", (2.0, 1.8)), ("999999999999h", (2.0, 1.8)), ("1" * 100 + "s", (2.0, 1.8)), ("1ms", (0.1, 0.09)),
    ("1h", (30.0, 29.8)), ("-5s", (0.1, 0.09)),
])
def test_deadline_from_the_timeout_the_api_server_sends(query: str | None, expected: tuple[float, float]) -> None:
    timeout, allowed = server.deadline(query)
    assert (timeout, allowed) == pytest.approx(expected)


# The deadline is the event loop's (`asyncio.timeout` in webhook.server's handler), which these tests share with the
# server, so they read the loop's clock. When the answer comes is checked as order and as a lower bound (the
# deadline was not cut short), never as an upper bound: how much later it comes is the machine's speed. That the
# deadline is the caller's timeout less the margin is test_deadline_from_the_timeout_the_api_server_sends's.
HANG = 30  # seconds: a guard against a hang, far above every deadline and keep-alive here, not a measurement


def loop_time() -> float:
    return asyncio.get_running_loop().time()


async def test_a_body_that_never_ends_is_answered_504_at_the_deadline(https: Server) -> None:
    _, allowed = server.deadline("1s")
    reader, writer = await https.raw()
    started = loop_time()  # before the request is sent: the server's deadline starts later
    writer.write(b"POST /validate/queues?timeout=1s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"apiVersion\": ")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), HANG)
    elapsed = loop_time() - started
    writer.close()
    assert answer.startswith(b"HTTP/1.1 504 ") and b"within the request's 1s timeout" in answer
    assert elapsed >= allowed, "answered at the deadline, not before it"


class Stuck:
    """A route that runs (in the worker thread, as a runaway computation would) until the test lets it finish."""

    def __init__(self) -> None:
        self.release, self.finished = threading.Event(), threading.Event()

    def route(self, request: admission.Request, lookup: Lookup) -> admission.ReviewResponse:
        self.release.wait(HANG)
        self.finished.set()
        return admission.response(request.uid, allowed=False, message="too late to matter")


@pytest.fixture
def stuck() -> Iterator[Stuck]:
    route = Stuck()
    yield route
    route.release.set()  # never leave the worker thread waiting


@pytest.fixture
async def slow(tls_dir: Path, stuck: Stuck, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    """A server whose routes finish only when the test says so (`stuck`)."""
    routes = {"/mutate/pods": Endpoint(stuck.route, admission.POD, mutating=True, offload=True),
              "/validate/queues": Endpoint(stuck.route, admission.QUEUE, offload=True)}
    monkeypatch.setattr(server, "ROUTES", routes)
    async for served in _serve(tls_dir):
        yield served


async def test_a_late_mutation_is_admitted_unchanged_at_the_deadline(slow: Server, stuck: Stuck) -> None:
    _, allowed = server.deadline("1s")
    started = loop_time()
    status, answer = await asyncio.wait_for(slow.post("/mutate/pods", review(POD), timeout="1s"), HANG)
    elapsed = loop_time() - started
    assert not stuck.finished.is_set(), "answered while the route still runs"
    assert status == 200 and answer["response"] == {
        "uid": "u-1", "allowed": True,
        "warnings": ["reservoir: not mutated: the webhook did not finish within the request's 1s timeout"]}
    assert elapsed >= allowed, "answered at the deadline, not before it"


async def test_a_late_validation_is_a_504_so_the_failure_policy_decides(slow: Server, stuck: Stuck) -> None:
    _, allowed = server.deadline("1s")
    started = loop_time()
    status, answer = await asyncio.wait_for(
        slow.post("/validate/queues", review({"spec": {}}, kind="Queue"), timeout="1s"), HANG)
    elapsed = loop_time() - started
    assert not stuck.finished.is_set(), "answered while the route still runs"
    assert status == 504 and answer == {"error": "the webhook did not finish within the request's 1s timeout"}
    assert elapsed >= allowed, "answered at the deadline, not before it"


# --- keep-alive and headers ---

def test_runner_options_bound_keep_alive_and_headers() -> None:
    options = server.runner_options()
    assert options["keepalive_timeout"] == 120.0 and options["lingering_time"] == 2.0
    assert options["max_line_size"] == options["max_field_size"] == 8190 and options["max_headers"] == 64
    assert options["auto_decompress"] is False


@pytest.fixture
async def short_keepalive(tls_dir: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    monkeypatch.setattr(server, "KEEPALIVE_TIMEOUT", 0.5)  # 120 s as shipped: a close within HANG is this one
    async for served in _serve(tls_dir):
        yield served


async def test_an_idle_connection_is_closed_after_the_keep_alive(short_keepalive: Server) -> None:
    reader, writer = await short_keepalive.raw()
    body = json.dumps(review(POD)).encode()
    started = loop_time()  # before the request: the idle time counts from its answer, later
    writer.write(b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    first = await asyncio.wait_for(reader.readuntil(b"\r\n"), HANG)
    assert first.startswith(b"HTTP/1.1 200")
    while await asyncio.wait_for(reader.read(65536), HANG):
        pass  # the rest of the answer, then the end of the connection
    assert loop_time() - started >= server.KEEPALIVE_TIMEOUT, "not closed before the keep-alive"
    writer.close()


async def test_a_connection_that_never_finishes_its_headers_is_closed(short_keepalive: Server) -> None:
    started = loop_time()  # before the connection: the keep-alive timer starts when it opens
    reader, writer = await short_keepalive.raw()
    writer.write(b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(65536), HANG) == b""
    assert loop_time() - started >= server.KEEPALIVE_TIMEOUT, "not closed before the keep-alive"
    writer.close()


async def test_an_oversized_header_is_refused(https: Server) -> None:
    async with https.session() as session, session.post("/mutate/pods", data=b"{}",
                                                        headers={"X-Big": "x" * 9000}) as response:
        assert response.status == 400


async def test_a_compressed_body_is_not_inflated(https: Server) -> None:
    import gzip

    bomb = gzip.compress(b" " * (20 * MIB))  # 20 KiB on the wire
    async with https.session() as session, session.post("/mutate/pods", data=bomb, headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip"}) as response:
        assert response.status == 400 and "not JSON" in (await response.json())["error"]


# --- fuzz cases from `make fuzz-webhook`, in process ---

async def test_fuzz_cases_never_get_a_5xx(https: Server) -> None:
    from bench.fuzz.cases import cases
    from bench.fuzz.webhook import Tally, send

    tally = Tally()
    async with https.session(limit=1) as session:
        for case in cases(seed=7, count=300):
            tally.add(case, *await send(session, case))
    assert tally.count == 300
    assert tally.server_errors == 0 and tally.unanswered == 0, [(s, c.route, c.what) for s, _, c in tally.failures]
    assert {route for route, _ in tally.statuses} == set(server.ROUTES)
    assert {status for _, status in tally.statuses} >= {200, 400}
    assert set(tally.answers) == {"allowed", "denied", "patched"}


# --- UPDATE over HTTPS: a Queue the cluster shrank under ---

async def test_queue_whose_guarantee_no_longer_fits_can_still_be_edited(https: Server) -> None:
    old = {"metadata": {"name": "big"}, "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}}}
    status, answer = await https.post("/validate/queues", review(old, kind="Queue"))
    assert status == 200 and answer["response"]["allowed"] is False, "on CREATE it is refused: the cluster has 4"
    edited = {"metadata": {"name": "big"}, "spec": {"weight": 5, "guarantee": {"resource": {"cpu": "8"}}}}
    status, answer = await https.post("/validate/queues", review(edited, "UPDATE", "Queue", old=old))
    assert answer["response"]["allowed"] is True and "kept as it was (this update does not raise it)" in \
        answer["response"]["warnings"][0]
    lowered = {"metadata": {"name": "big"}, "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "6"}}}}
    status, answer = await https.post("/validate/queues", review(lowered, "UPDATE", "Queue", old=old))
    assert answer["response"]["allowed"] is True
    raised = {"metadata": {"name": "big"}, "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "9"}}}}
    status, answer = await https.post("/validate/queues", review(raised, "UPDATE", "Queue", old=old))
    assert answer["response"]["allowed"] is False
    assert "spec.guarantee.resource.cpu (9) is more than the cluster's schedulable nodes hold (4)" in \
        answer["response"]["status"]["message"]
