"""Hostile AdmissionReviews for `make fuzz-webhook`, generated from real shapes with a seeded `random.Random`.

Each case starts from a real object of the kind its route serves (a Volcano job pod, a DaemonSet pod, a BestEffort
pod, a PodGroup, a Queue with a guarantee, a Reservation, the Reservoir ConfigMap, as the API server sends them)
and is made hostile at one or more places: huge and malformed quantities and durations, wrong types at the fields
the webhook reads and at random places, deep nesting, long strings, lone surrogates, NaN; then at the envelope
(apiVersion, uid, operation, kind, oldObject); then at the bytes (not JSON, truncated, non-UTF-8, UTF-16, nesting
past the parser's limit, integers of thousands of digits, bodies over 3 MiB sent whole or chunked, bodies just
under 3 MiB). Sometimes a body goes to a route of another kind. The same seed gives the same cases.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shared import keys

ROUTES = ("/mutate/pods", "/mutate/podgroups", "/validate/pods", "/validate/pod-locks", "/validate/podgroups",
          "/validate/queues", "/validate/reservations", "/validate/koordinator-reservations", "/validate/configmaps",
          "/noop")
MIB = 1024 * 1024
LIMIT = 3 * MIB


@dataclass(frozen=True)
class Case:
    route: str
    body: bytes
    chunked: bool = False  # sent with Transfer-Encoding: chunked (no Content-Length)
    what: str = ""  # what was made hostile, for the report of a failing case


# --- real objects ---

def _job_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "job-7-worker-", "namespace": "ns-7",
                     "labels": {"app": "svc-3", "volcano.sh/job-name": "job-7"},
                     "annotations": {keys.GROUP_NAME: "job-7", "volcano.sh/task-spec": "worker",
                                     keys.MAXIMUM_RUNTIME: "2h", keys.RESERVEABLE: "true"},
                     "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "job-7",
                                          "uid": "6c2c3a4e-0000-4000-8000-000000000007", "controller": True,
                                          "blockOwnerDeletion": True}],
                     "finalizers": ["example.com/keep"]},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox",
                                "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                               {"name": "log-shipper", "image": "fluent-bit", "restartPolicy": "Always",
                                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
            "containers": [{"name": "trainer", "image": "pytorch:2", "resources": {
                "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In",
                                                                        "values": ["z1"]}]}}]}},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "priority": 0, "schedulerName": "default-scheduler", "priorityClassName": "",
        },
    }


def _daemonset_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent-x7", "namespace": "monitoring", "labels": {"app": "agent"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                              "uid": "0000-ds", "controller": True}]},
            "spec": {"nodeName": "node-3", "containers": [{"name": "a", "image": "agent",
                                                           "resources": {"requests": {"cpu": "50m"}}}],
                     "tolerations": [{"operator": "Exists"}]}}


def _best_effort_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "scratch", "namespace": "team-a", "labels": {"app": "svc-1"},
                         "annotations": {keys.QUEUE_NAME: "q-1", keys.RESERVATION_AFFINITY: "r-1"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def _reservation_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "owner-0", "namespace": "team-b", "labels": {"app": "svc-2"},
                         "annotations": {keys.KOORDINATOR_RESERVATION_AFFINITY:
                                         json.dumps({"reservationSelector": {"pool": "a"}})}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {
                "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}}],
                     "resources": {"requests": {"cpu": "2"}}, "overhead": {"cpu": "10m"}}}


def _podgroup() -> dict[str, Any]:
    return {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
            "metadata": {"name": "job-7", "namespace": "ns-7",
                         "annotations": {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "90m"}},
            "spec": {"minMember": 4, "queue": "q-1", "priorityClassName": "",
                     "minResources": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"},
                     "minTaskMember": {"worker": 4}}}


def _queue() -> dict[str, Any]:
    return {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
            "metadata": {"name": "research", "annotations": {keys.QUEUE_PRIORITY_CLASS: "pc-3"}},
            "spec": {"weight": 2, "reclaimable": True, "priorityClassName": "pc-3",
                     "capability": {"cpu": "64", "memory": "256Gi"}, "deserved": {"cpu": "32", "memory": "128Gi"},
                     "guarantee": {"policy": "Guaranteed", "resource": {"cpu": "16", "memory": "64Gi"},
                                   "percentage": {"dimensions": ["cpu", "memory"], "value": 0.25}}}}


def _reservation() -> dict[str, Any]:
    return {"apiVersion": "reservoir.sh/v1alpha1", "kind": "Reservation",
            "metadata": {"name": "r-1", "labels": {"pool": "a"}},
            "spec": {"owners": [{"labelSelector": {"matchLabels": {"app": "svc-2"}}},
                                {"object": {"name": "owner-0", "namespace": "team-b"}},
                                {"controller": {"kind": "Job", "name": "job-7", "namespace": "ns-7"}}],
                     "template": {"spec": {"containers": [{"name": "c", "resources": {
                         "requests": {"cpu": "4", "memory": "8Gi"}}}], "nodeSelector": {"zone": "z1"}}},
                     "ttl": "24h", "allocateOnce": True, "allocatePolicy": "Aligned", "preAllocation": False}}


def _koordinator_reservation() -> dict[str, Any]:
    """Issue 18: a Koordinator Reservation as its CRD stores it (ttl defaulted beside expires), with the fields
    Reservoir warns about."""
    body = _reservation()
    body["apiVersion"] = keys.KOORDINATOR_API_VERSION
    body["metadata"]["labels"][keys.KOORDINATOR_RESERVATION_ORDER] = "2"
    body["spec"].update({"expires": "2026-12-01T00:00:00Z", "taints": [{"key": "t", "effect": "NoSchedule"}],
                         "preAllocationPolicy": {"mode": "Default"}})
    return body


_CONFIG = """dryRun: false
maxLockedNodePercent: 50
starvation: {enabled: true, starvingJobTimeThreshold: 10m, reservedNodePercent: 20, maxLockDuration: 2h}
windows:
- {name: nightly, nodeSelector: {pool: batch}, resources: {cpu: 32, memory: 128Gi}, schedule: "0 3 * * *",
   duration: 1h, startReserveAgo: 30m, podNumToReserve: 4}
queueOrder: {priorityWeight: 1, drfWeight: 1, proportionWeight: 1}
guarantee: {enabled: true, searchBudget: 2000}
"""


def _configmap() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
            "data": {keys.CONFIG_KEY: _CONFIG}}


OBJECTS = {
    "/mutate/pods": (_job_pod, _daemonset_pod, _best_effort_pod, _reservation_pod),
    "/validate/pods": (_job_pod, _daemonset_pod, _best_effort_pod, _reservation_pod),
    "/validate/pod-locks": (_job_pod, _daemonset_pod, _best_effort_pod, _reservation_pod),
    "/mutate/podgroups": (_podgroup,),
    "/validate/podgroups": (_podgroup,),
    "/validate/queues": (_queue,),
    "/validate/reservations": (_reservation,),
    "/validate/koordinator-reservations": (_koordinator_reservation,),
    "/validate/configmaps": (_configmap,),
    "/noop": (_job_pod,),
}
KIND = {"/mutate/pods": "Pod", "/validate/pods": "Pod", "/validate/pod-locks": "Pod", "/mutate/podgroups": "PodGroup",
        "/validate/podgroups": "PodGroup", "/validate/queues": "Queue", "/validate/reservations": "Reservation",
        "/validate/koordinator-reservations": "Reservation",
        "/validate/configmaps": "ConfigMap", "/noop": "Pod"}

# --- hostile values ---

QUANTITIES: tuple[Any, ...] = (
    "1e999999999", "1e10000000", "1e7", "1e41", "1e-41", "9" * 40, "9" * 41, "9" * 64, "9" * 65, "9" * 5000,
    "1e1.5", "banana", "", " ", "-1", "-1e40", "+1", "1.", ".", "..1", "0x10", "1 Gi", "1Gi ", "1GiB", "1ki",
    "99999999999999999999Ei", "9223372036854775808", "0.0000000000000000000001", "1e", "e3", "1E3", "1e+3",
    "\u221e", "\ud800", "\x00", "1" + "0" * 39 + "m", 10**30, -5, 2**63, 1.5, float("inf"), True, None, [], {},
    ["1"], {"cpu": "1"},
)
DURATIONS: tuple[Any, ...] = (
    "999999999999h", "2562047h47m16.854775807s", "2562047h47m16.854775808s", "9223372036854775807ns",
    "9223372036854775808ns", "1" * 100 + "s", "1" * 64 + "h", "1.5.5h", "-5s", "0", "", "h", "1d", "5µs", "5μs",
    "1e3s", ".s", "1..5s", "+-1s", "0x10s", "1h" * 40, "\ud800", 5, 1.5, None, [], {}, True,
)
STRINGS: tuple[Any, ...] = (
    "", "a" * 300, "x" * 70_000, "\ud800", "\udfff\ud800", "\x00\x01", "é" * 1000, "{" * 5000, "[" * 50,
    '{"name": ' * 500 + '"x"' + "}" * 500, '{"reservationSelector": {}}', '{"reservationSelector": {"a": 1}}',
    '{"name": ["x"]}', "../../etc", "a/b/c~0~1", "😀" * 100,
)
WRONG_TYPES: tuple[Any, ...] = (None, True, False, 0, -1, 1.5, 10**20, "", "x", [], [1, "a", None], {},
                                {"a": {"b": []}},
                                [[[]]], [{}], {"": None})
YAML: tuple[str, ...] = (
    "",
    "dryRun: [",
    "maxLockedNodePercent: 150",
    "maxLockedNodePercent: 1e999",
    "resyncPeriod: 999999999999h",
    "debounce: 1" + "0" * 5000 + "s",
    "windows: [" + "{name: w, resources: {cpu: 1e999999999}, schedule: '0 3 * * *', duration: 1h}]",
    "windows:\n- {name: w, resources: {cpu: 1}, schedule: '99 99 * * *', duration: 1h}",
    "windows: " + "[" * 20000,
    "a: " + "{a: " * 5000,
    "x: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}" if i > 1 else "*a"] * 10)
                                              + "]\n" for i in range(1, 9)),
    "starvation: !!python/object/apply:os.system ['true']",
    "\t\x00\x01",
    "dryRun: true\n" + "# " + "x" * 70_000,
    "guarantee: {searchBudget: " + "9" * 5000 + "}",
    "webhook: {tolerateBestEffort: [1, 2]}",
)

# issue 18: Koordinator's affinity forms, well-formed and not
AFFINITIES: tuple[Any, ...] = (
    '{"reservationSelectorTerms": []}', '{"requiredDuringSchedulingIgnoredDuringExecution": 5}',
    '{"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [{"matchExpressions": '
    '[{"key": "pool", "operator": "Gt", "values": ["' + "9" * 5000 + '"]}]}]}}',
    '{"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [{"matchFields": '
    '[{"key": "metadata.name", "operator": "In", "values": ["r-1"]}]}]}}',
    '{"tolerations": [{"key": 5}]}', '{"tolerations": "all"}', '{"name": "r-1", "tolerations": [{"operator": '
    '"Exists"}], "extra": 1}', '{"name": ""}', '{"reservationSelector": {"a": 1}}',
)

# fields the webhook reads, by route kind, as paths of keys (lists are indexed by int)
TARGETS: dict[str, tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]] = {
    "Pod": (
        (("metadata", "annotations", keys.MAXIMUM_RUNTIME), DURATIONS),
        (("metadata", "annotations", keys.RESERVEABLE), STRINGS + WRONG_TYPES),
        (("metadata", "annotations", keys.RESERVATION_AFFINITY), STRINGS + WRONG_TYPES),
        (("metadata", "annotations", keys.KOORDINATOR_RESERVATION_AFFINITY), STRINGS + AFFINITIES),
        (("metadata", "labels", keys.KOORDINATOR_RESERVATION_IGNORED), STRINGS + WRONG_TYPES),
        (("metadata", "annotations", keys.GROUP_NAME), STRINGS + WRONG_TYPES),
        (("metadata", "annotations", keys.QUEUE_NAME), STRINGS + WRONG_TYPES),
        (("metadata", "annotations"), WRONG_TYPES),
        (("metadata", "labels"), WRONG_TYPES),
        (("metadata", "name"), STRINGS + WRONG_TYPES),
        (("metadata", "ownerReferences"), WRONG_TYPES),
        (("metadata", "ownerReferences", 0, "controller"), WRONG_TYPES),
        (("metadata",), WRONG_TYPES),
        (("spec",), WRONG_TYPES),
        (("spec", "tolerations"), WRONG_TYPES),
        (("spec", "tolerations", 0), WRONG_TYPES),
        (("spec", "tolerations", 0, "key"), WRONG_TYPES),
        (("spec", "containers"), WRONG_TYPES),
        (("spec", "containers", 0, "resources"), WRONG_TYPES),
        (("spec", "containers", 0, "resources", "requests"), WRONG_TYPES),
        (("spec", "containers", 0, "resources", "requests", "cpu"), QUANTITIES),
        (("spec", "containers", 0, "resources", "limits", "memory"), QUANTITIES),
        (("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"), QUANTITIES),
        (("spec", "initContainers", 0, "resources", "requests", "cpu"), QUANTITIES),
        (("spec", "resources", "requests", "cpu"), QUANTITIES),
        (("spec", "overhead", "cpu"), QUANTITIES),
        (("spec", "affinity"), WRONG_TYPES),
        (("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"), WRONG_TYPES),
        (("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
          "nodeSelectorTerms", 0, "matchExpressions"), WRONG_TYPES),
        (("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), WRONG_TYPES),
        (("spec", "priorityClassName"), STRINGS + WRONG_TYPES),
        (("spec", "priority"), WRONG_TYPES),
        (("spec", "nodeName"), STRINGS + WRONG_TYPES),
        (("spec", "nodeSelector"), WRONG_TYPES),
    ),
    "PodGroup": (
        (("spec", "minResources", "cpu"), QUANTITIES),
        (("spec", "minResources", "nvidia.com/gpu"), QUANTITIES),
        (("spec", "minResources", "x" * 300), QUANTITIES),
        (("spec", "minResources"), WRONG_TYPES),
        (("spec", "queue"), STRINGS + WRONG_TYPES),
        (("spec", "priorityClassName"), STRINGS + WRONG_TYPES),
        (("spec", "minMember"), WRONG_TYPES),
        (("spec",), WRONG_TYPES),
        (("metadata", "annotations", keys.MAXIMUM_RUNTIME), DURATIONS),
        (("metadata", "annotations", keys.RESERVEABLE), STRINGS),
        (("metadata", "annotations"), WRONG_TYPES),
    ),
    "Queue": (
        (("spec", "capability", "cpu"), QUANTITIES),
        (("spec", "deserved", "memory"), QUANTITIES),
        (("spec", "guarantee", "resource", "cpu"), QUANTITIES),
        (("spec", "guarantee", "resource", "hugepages-2Mi"), QUANTITIES),
        (("spec", "guarantee", "resource"), WRONG_TYPES),
        (("spec", "guarantee", "percentage", "value"), WRONG_TYPES + (float("nan"), 1e308, -0.0)),
        (("spec", "guarantee", "percentage", "dimensions"), WRONG_TYPES + (["cpu", 5], ["x" * 5000])),
        (("spec", "guarantee", "policy"), STRINGS + WRONG_TYPES),
        (("spec", "guarantee"), WRONG_TYPES),
        (("spec", "capability"), WRONG_TYPES),
        (("spec", "deserved"), WRONG_TYPES),
        (("spec",), WRONG_TYPES),
    ),
    "Reservation": (
        (("spec", "ttl"), DURATIONS),
        (("spec", "expires"), STRINGS + WRONG_TYPES + ("2026-13-45T99:99:99Z", "9999-12-31T23:59:59Z")),
        (("spec", "owners"), WRONG_TYPES),
        (("spec", "owners", 0), WRONG_TYPES),
        (("spec", "owners", 0, "labelSelector"), WRONG_TYPES),
        (("spec", "owners", 0, "labelSelector", "matchLabels"), WRONG_TYPES),
        (("spec", "owners", 1, "object", "name"), WRONG_TYPES),
        (("spec", "template"), WRONG_TYPES),
        (("spec", "template", "spec"), WRONG_TYPES),
        (("spec", "template", "spec", "containers"), WRONG_TYPES),
        (("spec", "template", "spec", "containers", 0, "resources", "requests", "cpu"), QUANTITIES),
        (("spec", "allocatePolicy"), STRINGS + WRONG_TYPES),
        (("spec", "taints"), WRONG_TYPES),
        (("spec", "taints", 0), WRONG_TYPES),
        (("spec", "taints", 0, "effect"), STRINGS + WRONG_TYPES),
        (("spec", "preAllocationPolicy"), WRONG_TYPES),
        (("spec", "owners", 2, "controller", "controller"), WRONG_TYPES),
        (("metadata", "labels", keys.KOORDINATOR_RESERVATION_ORDER), STRINGS + WRONG_TYPES),
        (("spec",), WRONG_TYPES),
    ),
    "ConfigMap": (
        (("data", keys.CONFIG_KEY), YAML),
        (("data", keys.CONFIG_KEY), WRONG_TYPES),
        (("data",), WRONG_TYPES),
        (("data", "other.yaml"), STRINGS),
        (("metadata", "name"), WRONG_TYPES),
    ),
}


NESTED = re.compile(r'"__nested_(\d+)_(\d+)__"')


def nested(rng: random.Random, depth: int) -> str:
    """A placeholder for a list or object nested `depth` deep, written out by `_dumps` (json.dumps itself would
    recurse too deep)."""
    return f"__nested_{depth}_{rng.getrandbits(16)}__"


def _nested_text(match: re.Match[str]) -> str:
    depth, bits = int(match[1]), int(match[2])
    opening = "".join('{"a": ' if bits >> (level % 16) & 1 else "[" for level in range(depth))
    closing = "".join("}" if bits >> (level % 16) & 1 else "]" for level in reversed(range(depth)))
    return f"{opening}null{closing}"


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    """Set `path` in `obj` to `value`, making objects on the way (a step through something else is skipped)."""
    for step in path[:-1]:
        if isinstance(obj, dict):
            if not isinstance(obj.get(step), (dict, list)):
                obj[step] = {}
            obj = obj[step]
        elif isinstance(obj, list) and isinstance(step, int) and step < len(obj):
            obj = obj[step]
        else:
            return
    last = path[-1]
    if isinstance(obj, dict):
        obj[last] = value
    elif isinstance(obj, list) and isinstance(last, int) and last < len(obj):
        obj[last] = value


def _random_place(rng: random.Random, obj: Any) -> tuple[Any, Any] | None:
    """A random (container, key) inside `obj`."""
    places: list[tuple[Any, Any]] = []
    stack = [obj]
    while stack and len(places) < 500:
        here = stack.pop()
        items = here.items() if isinstance(here, dict) else enumerate(here) if isinstance(here, list) else ()
        for key, value in items:
            places.append((here, key))
            if isinstance(value, (dict, list)):
                stack.append(value)
    return rng.choice(places) if places else None


def hostile_object(rng: random.Random, route: str) -> tuple[dict[str, Any], list[str]]:
    """A real object for `route` with 1-3 hostile changes; and what they were."""
    obj = rng.choice(OBJECTS[route])()
    notes: list[str] = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        roll = rng.random()
        if roll < 0.6:
            path, pool = rng.choice(TARGETS[KIND[route]])
            value = rng.choice(pool)
            _set(obj, path, copy.deepcopy(value))
            notes.append(f"{'.'.join(map(str, path))}={value!r:.60}")
        elif roll < 0.8:
            place = _random_place(rng, obj)
            if place is not None:
                value = rng.choice(WRONG_TYPES + STRINGS[:4] + QUANTITIES[:6] + DURATIONS[:4])
                place[0][place[1]] = copy.deepcopy(value)
                notes.append(f"random {place[1]!r:.30}={value!r:.40}")
        elif roll < 0.9:
            depth = rng.choice((10, 100, 500, 900, 990))
            path, _ = rng.choice(TARGETS[KIND[route]])
            _set(obj, path if rng.random() < 0.5 else ("spec", "extra"), nested(rng, depth))
            notes.append(f"nested {depth} deep")
        else:
            place = _random_place(rng, obj)
            if place is not None and isinstance(place[0], dict):
                place[0].pop(place[1], None)
                notes.append(f"removed {place[1]!r:.30}")
    return obj, notes


def review(rng: random.Random, route: str, obj: Any, notes: list[str]) -> dict[str, Any]:
    """The AdmissionReview the API server would send for `obj`, sometimes an UPDATE with an old object, sometimes
    with a hostile envelope."""
    operation = rng.choice(("CREATE", "CREATE", "CREATE", "UPDATE", "UPDATE", "DELETE"))
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    request: dict[str, Any] = {
        "uid": f"fuzz-{rng.getrandbits(48):012x}",
        "kind": {"group": "", "version": "v1", "kind": KIND[route]},
        "resource": {"group": "", "version": "v1", "resource": KIND[route].lower() + "s"},
        "operation": operation, "namespace": meta.get("namespace", "") if isinstance(meta.get("namespace"), str)
        else "", "name": meta.get("name", "") if isinstance(meta.get("name"), str) else "",
        "userInfo": {"username": "system:serviceaccount:team-a:builder", "groups": ["system:authenticated"]},
        "object": obj, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if operation in ("UPDATE", "DELETE"):
        old = rng.choice(OBJECTS[route])() if rng.random() < 0.5 else hostile_object(rng, route)[0]
        request["oldObject"] = old
        if operation == "DELETE":
            request["object"] = None
    body: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    if rng.random() < 0.12:
        field, value = rng.choice((
            ("uid", None), ("uid", 5), ("uid", ""), ("uid", "u" * 1000), ("operation", "PATCH"), ("operation", None),
            ("operation", ["CREATE"]), ("kind", "Pod"), ("kind", {"kind": 5}), ("namespace", 7),
            ("namespace", "n" * 300), ("name", {}), ("object", []), ("object", "x"), ("object", None),
            ("oldObject", 5), ("oldObject", []), ("dryRun", "yes"), ("request", None),
            ("apiVersion", "admission.k8s.io/v1beta1"), ("kind", None),
        ))
        if field in ("apiVersion", "request") or (field == "kind" and value is None):
            body[field] = value
        else:
            request[field] = value
        notes.append(f"envelope {field}={value!r:.40}")
    return body


def _dumps(rng: random.Random, body: Any) -> bytes:
    text = json.dumps(body, ensure_ascii=rng.random() < 0.5)
    return NESTED.sub(_nested_text, text).encode("utf-8", "surrogatepass")


def _bytes_case(rng: random.Random, route: str, encoded: bytes, notes: list[str]) -> tuple[bytes, bool]:
    """Hostile bytes: the body itself broken, huge or odd; (body, chunked)."""
    kind = rng.choice(("truncated", "random", "non-utf8", "utf16", "deep", "bigint", "nan", "over-limit",
                       "over-limit-chunked", "near-limit", "empty", "bom", "trailing"))
    notes.append(f"bytes {kind}")
    if kind == "truncated":
        return encoded[:rng.randrange(max(1, len(encoded)))], False
    if kind == "random":
        return rng.randbytes(rng.choice((1, 16, 300, 4096))), False
    if kind == "non-utf8":
        cut = rng.randrange(max(1, len(encoded)))
        broken = rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"))
        return encoded[:cut] + broken + encoded[cut:], False
    if kind == "utf16":
        return encoded.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass"), False
    if kind == "deep":
        depth = rng.choice((2000, 100_000, 1_000_000))
        return b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": ' + b"[" * depth, False
    if kind == "bigint":
        return encoded.replace(b'"dryRun": false', b'"dryRun": ' + b"9" * 100_000, 1), False
    if kind == "nan":
        return encoded.replace(b'"dryRun": false', b'"dryRun": NaN', 1), False
    if kind in ("over-limit", "over-limit-chunked"):
        pad = b" " * (LIMIT + rng.choice((1, 1000, MIB)) - len(encoded))
        return encoded + pad, kind.endswith("chunked")
    if kind == "near-limit":
        filler = "x" * (LIMIT - len(encoded) - rng.choice((200, 50_000, MIB)))
        return encoded.replace(b'"dryRun": false', b'"dryRun": false, "pad": "' + filler.encode() + b'"', 1), \
            rng.random() < 0.5
    if kind == "bom":
        return b"\xef\xbb\xbf" + encoded, False
    if kind == "trailing":
        return encoded + b" {}", False
    return b"", False


def cases(seed: int, count: int) -> Iterator[Case]:
    """`count` hostile requests over every route, the same ones for the same seed."""
    rng = random.Random(seed)
    for index in range(count):
        route = ROUTES[index % len(ROUTES)]
        source = route if rng.random() < 0.9 else rng.choice(ROUTES)  # sometimes a body of another kind
        obj, notes = hostile_object(rng, source)
        body = review(rng, source, obj, notes)
        encoded = _dumps(rng, body)
        chunked = rng.random() < 0.05
        if rng.random() < 0.1:
            encoded, chunked = _bytes_case(rng, route, encoded, notes)
        if source != route:
            notes.append(f"a {KIND[source]} to {route}")
        yield Case(route, encoded, chunked, "; ".join(notes))
