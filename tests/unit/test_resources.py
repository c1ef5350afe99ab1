import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.resources import Resources, is_best_effort, pod_requests, qos_class


def c(name: str, requests: dict | None = None, limits: dict | None = None, restart: str | None = None) -> dict:
    container: dict = {"name": name, "image": "x"}
    resources = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    if resources:
        container["resources"] = resources
    if restart:
        container["restartPolicy"] = restart
    return container


def R(**amounts: int) -> Resources:
    return Resources({k.replace("_", "-"): v for k, v in amounts.items()})


def test_vector_arithmetic() -> None:
    a = Resources.parse({"cpu": "1", "memory": "1Gi"})
    b = Resources.parse({"cpu": "500m", "nvidia.com/gpu": "1"})
    assert (a + b)["cpu"] == 1500 and (a + b)["nvidia.com/gpu"] == 1
    assert (a - a) == Resources()
    assert (b - a)["memory"] == -(2**30)
    assert (b - a).clamp_negative() == Resources({"cpu": 0, "nvidia.com/gpu": 1})
    assert b.fits_in({"cpu": 500, "nvidia.com/gpu": 1})
    assert not b.fits_in({"cpu": 500})
    assert a.covers({"cpu": 1000}) and not a.covers({"cpu": 1001})
    assert a.maximum(b)["cpu"] == 1000 and a.maximum(b)["nvidia.com/gpu"] == 1
    assert a.to_quantities() == {"cpu": "1", "memory": "1Gi"}
    assert hash(a) == hash(Resources.parse({"memory": "1Gi", "cpu": "1000m"}))


def test_plain_containers_sum_plus_one_pod() -> None:
    spec = {"containers": [c("a", {"cpu": "1", "memory": "1Gi"}), c("b", {"cpu": "250m"})]}
    assert pod_requests(spec) == R(cpu=1250, memory=2**30, pods=1)


def test_limit_stands_in_for_missing_request() -> None:
    spec = {"containers": [c("a", limits={"cpu": "2", "memory": "1Gi"})]}
    assert pod_requests(spec) == R(cpu=2000, memory=2**30, pods=1)


def test_init_container_peak_wins_when_larger() -> None:
    spec = {"initContainers": [c("init", {"cpu": "3"})], "containers": [c("a", {"cpu": "1", "memory": "1Gi"})]}
    assert pod_requests(spec) == R(cpu=3000, memory=2**30, pods=1)


def test_sidecars_add_to_containers_and_to_later_init_containers() -> None:
    spec = {
        "initContainers": [
            c("first", {"cpu": "2"}),
            c("sidecar", {"cpu": "500m", "memory": "1Gi"}, restart="Always"),
            c("after-sidecar", {"cpu": "1800m"}),
        ],
        "containers": [c("main", {"cpu": "1", "memory": "1Gi"})],
        "overhead": {"cpu": "100m"},
    }
    # containers + sidecar = 1.5 cpu; init peak = max(2, 0.5, 1.8 + 0.5) = 2.3 cpu; + 100m overhead.
    assert pod_requests(spec) == R(cpu=2400, memory=2 * 2**30, pods=1)


def test_pod_level_resources_replace_cpu_and_memory() -> None:
    spec = {"resources": {"requests": {"cpu": "4"}},
            "containers": [c("a", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"})]}
    assert pod_requests(spec) == Resources({"cpu": 4000, "memory": 2**30, "nvidia.com/gpu": 1, "pods": 1})


@pytest.mark.parametrize(("spec", "qos"), [
    ({"containers": [c("a")]}, "BestEffort"),
    ({"containers": [c("a", {"nvidia.com/gpu": "1"})]}, "BestEffort"),
    ({"containers": [c("a"), c("b", {"cpu": "1"})]}, "Burstable"),
    ({"containers": [c("a", {"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})]}, "Guaranteed"),
    ({"containers": [c("a", limits={"cpu": "1", "memory": "1Gi"})]}, "Guaranteed"),
    ({"containers": [c("a", {"cpu": "500m", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})]}, "Burstable"),
    ({"initContainers": [c("i", {"memory": "1Gi"})], "containers": [c("a")]}, "Burstable"),
])
def test_qos_class(spec: dict, qos: str) -> None:
    assert qos_class(spec) == qos


@pytest.mark.parametrize(("spec", "best_effort"), [
    ({"containers": [c("a")]}, True),
    ({"containers": [c("a", {})]}, True),
    # Volcano's BestEffort: an extended resource alone makes a pod not BestEffort (the QoS class says BestEffort)
    ({"containers": [c("a", {"nvidia.com/gpu": "8"})]}, False),
    ({"containers": [c("a", limits={"nvidia.com/gpu": "8"})]}, False),
    ({"containers": [c("a"), c("b", {"cpu": "1"})]}, False),
    ({"initContainers": [c("i", {"memory": "1Gi"})], "containers": [c("a")]}, False),
    ({"resources": {"limits": {"cpu": "1"}}, "containers": [c("a")]}, False),
])
def test_best_effort_means_no_request_or_limit_of_any_resource(spec: dict, best_effort: bool) -> None:
    assert is_best_effort(spec) is best_effort


def by_vectors(spec: dict) -> Resources:
    """pod_requests' formula in Resources arithmetic, one vector per step (what it computed before it summed in
    dicts): the oracle of the property test below."""
    def container(one: dict) -> Resources:
        resources = one.get("resources") or {}
        return Resources.parse({**(resources.get("limits") or {}), **(resources.get("requests") or {})})

    total = sidecars = peak = Resources()
    for one in spec.get("containers") or ():
        total = total + container(one)
    for one in spec.get("initContainers") or ():
        request = container(one)
        if one.get("restartPolicy") == "Always":
            total, sidecars = total + request, sidecars + request
            peak = peak.maximum(sidecars)
        else:
            peak = peak.maximum(request + sidecars)
    total = total.maximum(peak)
    pod_level = Resources.parse((spec.get("resources") or {}).get("requests") or {})
    if pod_level:
        total = Resources({**dict(total), **{n: pod_level[n] for n in ("cpu", "memory") if n in pod_level}})
    return total + Resources.parse(spec.get("overhead") or {}) + {"pods": 1}


amounts = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]),
                          st.sampled_from(["0", "1", "250m", "2", "-1", "1Gi", "3"]), max_size=3)
containers = st.builds(c, st.just("x"), st.none() | amounts, st.none() | amounts,
                       st.sampled_from([None, "Always", "OnFailure"]))


@settings(max_examples=300, deadline=None)
@given(spec=st.fixed_dictionaries({"containers": st.lists(containers, max_size=3)},
                                  optional={"initContainers": st.lists(containers, max_size=4),
                                            "resources": st.fixed_dictionaries({"requests": amounts}),
                                            "overhead": amounts}))
def test_any_pod_requests_what_the_formula_in_vectors_gives(spec: dict) -> None:
    """Containers, sidecars, init containers, pod-level requests and overhead in any mix, zero and negative amounts
    among them: the sum in dicts is the formula's, step by step in vectors."""
    assert pod_requests(spec) == by_vectors(spec)
