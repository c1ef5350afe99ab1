import pytest

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
