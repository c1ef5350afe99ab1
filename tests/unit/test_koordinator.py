"""Issue 18, Koordinator compatibility, without a cluster: owner matching by Koordinator's rules (one case per rule,
and the two departures that keep a tenant from reaching further), every reservation-affinity form and the other
pod-side keys, the Koordinator Reservation as a second source of the same model (keys that cannot collide, ttl beside
expires, reservation-order, a second writer seen in managedFields), the planner, the webhook's mutation and warnings,
and the deploy switch (kustomize component and Helm value; the base install unchanged)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import yaml

from agent.planner.model import koordinator_allocated
from agent.planner.reservations import expiry
from agent.writer import owner_object
from shared import keys, kinds
from shared.config import ReservoirConfig, load_config
from shared.matching import owner_matches, reservation_matches
from shared.ownership import reservation_owner_id
from shared.reservation_affinity import may_use, parse_reservation_affinity
from shared.timestamps import stamp
from shared.views import KOORDINATOR_SOURCE, ReservationView
from tests.builders import NOW
from tests.unit.test_deploy import CHART, DEPLOY, helm_template, kustomize
from tests.unit.test_reservations import Cluster, node_obj, pod_obj
from webhook.lookup import Lookup
from webhook.mutate import mutate_pod
from webhook.validate import validate_pod, validate_reservation

NS = "team-a"
JOB_REF = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid"}


def pod(name: str = "p", *, namespace: str = NS, labels: dict | None = None, annotations: dict | None = None,
        owner_refs: list | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {},
                         "annotations": annotations or {}, "ownerReferences": owner_refs or []}}


def koord(name: str, *, owners: list | None = None, labels: dict | None = None, phase: str = "Available",
          managed: list | None = None, cpu: str = "1", age: timedelta = timedelta(minutes=1),
          **spec: Any) -> ReservationView:
    """A Koordinator Reservation as its CRD stores it: ttl defaulted to 24h."""
    return ReservationView.from_koordinator({
        "apiVersion": keys.KOORDINATOR_API_VERSION, "kind": "Reservation",
        "metadata": {"name": name, "uid": f"k-{name}", "labels": labels or {}, "managedFields": managed or [],
                     "creationTimestamp": stamp(NOW - age)},
        "spec": {"template": {"spec": {"containers": [{"name": "r", "resources": {"requests": {"cpu": cpu}}}]}},
                 "owners": owners or [{"object": {"namespace": NS}}], "ttl": "24h", **spec},
        "status": {"phase": phase} if phase else {}})


# --- owner matching (shared.matching), one case per rule of Koordinator's pkg/util/reservation ---

def test_a_namespace_only_object_matches_every_pod_of_that_namespace_and_no_other() -> None:
    owner = {"object": {"namespace": NS}}
    assert owner_matches(owner, pod("a"), NS) and owner_matches(owner, pod("b"), NS)
    assert not owner_matches(owner, pod("a", namespace="team-b"), "team-b")


def test_object_kind_and_api_version_are_ignored() -> None:
    assert owner_matches({"object": {"kind": "Deployment", "apiVersion": "apps/v1", "name": "p", "namespace": NS}},
                         pod("p"), NS)


def test_an_object_naming_nothing_matches_no_pod_a_departure() -> None:
    """Koordinator's empty object would match every pod of the cluster, every tenant's."""
    assert not owner_matches({"object": {"kind": "Pod"}}, pod("p"), NS)


def test_a_controller_without_controller_true_matches_any_owner_reference_with_its_fields() -> None:
    owner = {"controller": {**JOB_REF, "namespace": NS}}
    assert owner_matches(owner, pod(owner_refs=[JOB_REF]), NS), "not a controller reference, still matched"
    assert owner_matches(owner, pod(owner_refs=[{**JOB_REF, "controller": True}]), NS)
    assert not owner_matches(owner, pod(owner_refs=[{**JOB_REF, "uid": "other"}]), NS)


def test_a_controller_that_sets_controller_requires_the_same_on_the_reference() -> None:
    wants = {"controller": {**JOB_REF, "namespace": NS, "controller": True}}
    assert not owner_matches(wants, pod(owner_refs=[JOB_REF]), NS)
    assert owner_matches(wants, pod(owner_refs=[{**JOB_REF, "controller": True}]), NS)


def test_a_controller_not_confined_to_a_namespace_matches_nothing_a_departure() -> None:
    """A tenant in another namespace writes the same ownerReference on its own pod: it must not match."""
    forged = pod("intruder", namespace="team-b", owner_refs=[{**JOB_REF, "controller": True}])
    assert not owner_matches({"controller": JOB_REF}, forged, "team-b")
    assert not owner_matches({"controller": {**JOB_REF, "namespace": NS}}, forged, "team-b")
    # confined through the same entry's object.namespace (ANDed anyway)
    assert owner_matches({"object": {"namespace": NS}, "controller": JOB_REF}, pod(owner_refs=[JOB_REF]), NS)


def test_fields_of_one_entry_are_anded_and_entries_are_ored() -> None:
    both = {"object": {"namespace": NS}, "labelSelector": {"matchLabels": {"app": "web"}}}
    assert owner_matches(both, pod(labels={"app": "web"}), NS)
    assert not owner_matches(both, pod(labels={"app": "db"}), NS)
    either: list[dict[str, Any]] = [{"object": {"name": "x", "namespace": NS}},
                                    {"labelSelector": {"matchLabels": {"app": "db"}}}]
    assert reservation_matches(either, pod(labels={"app": "db"}), NS)
    assert reservation_matches(either, pod("x"), NS)
    assert not reservation_matches(either, pod("y"), NS)


# --- the affinity annotation, every form (shared.reservation_affinity) ---

def test_affinity_by_plain_name_and_by_json_name() -> None:
    r, other = koord("r"), koord("other")
    for text in ("r", '{"name": "r"}'):
        affinity = parse_reservation_affinity(text)
        assert affinity.restricts and affinity.selects(r) and not affinity.selects(other)


def test_affinity_by_reservation_selector() -> None:
    affinity = parse_reservation_affinity('{"reservationSelector": {"pool": "gpu"}}')
    assert affinity.selects(koord("a", labels={"pool": "gpu", "x": "y"}))
    assert not affinity.selects(koord("b", labels={"pool": "cpu"}))


def test_affinity_by_reservation_selector_terms_ored_with_requirements_anded() -> None:
    text = json.dumps({"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]},
                              {"key": "size", "operator": "Gt", "values": ["4"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["by-name"]}]}]}})
    affinity = parse_reservation_affinity(text)
    assert affinity.selects(koord("a", labels={"pool": "gpu", "size": "8"}))
    assert not affinity.selects(koord("b", labels={"pool": "gpu", "size": "2"})), "requirements ANDed"
    assert affinity.selects(koord("by-name")), "terms ORed; matchFields on metadata.name"


def test_affinity_constraints_are_anded() -> None:
    affinity = parse_reservation_affinity('{"name": "a", "reservationSelector": {"pool": "gpu"}}')
    assert affinity.selects(koord("a", labels={"pool": "gpu"}))
    assert not affinity.selects(koord("a", labels={"pool": "cpu"}))


def test_affinity_tolerations_alone_narrow_nothing_and_unknown_keys_are_named() -> None:
    affinity = parse_reservation_affinity('{"tolerations": [{"key": "t", "operator": "Exists"}], "preferred": 1}')
    assert not affinity.restricts and affinity.tolerations == ({"key": "t", "operator": "Exists"},)
    assert affinity.ignored == ("preferred",)


@pytest.mark.parametrize(("text", "field"), [
    ('{"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": []}}',
     "reservationSelectorTerms"),
    ('{"requiredDuringSchedulingIgnoredDuringExecution": 5}', "requiredDuringSchedulingIgnoredDuringExecution"),
    ('{"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [{"matchFields": '
     '[{"key": "metadata.labels", "operator": "In", "values": ["x"]}]}]}}', "matchFields"),
    ('{"tolerations": "all"}', "tolerations"),
    ('{"reservationSelector": {}}', "empty reservationSelector"),
    ('{"name": ""}', "name"),
    ('{"other": 1}', "expected"),
    # review finding L5: a name no Reservation can have, a Koordinator key above all, is refused
    ('{"name": "scheduling.koordinator.sh/r1"}', "DNS subdomain"),
    ("scheduling.koordinator.sh/r1", "DNS subdomain"),
    ("R1", "DNS subdomain"),
    ("x" * 254, "DNS subdomain"),
])
def test_a_malformed_affinity_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_reservation_affinity(text)


# --- who may use a Reservation: owners, reservation-ignored, spec.taints ---

def test_a_reservation_ignored_pod_uses_no_reservation() -> None:
    assert may_use(koord("r"), pod(), NS)
    assert not may_use(koord("r"), pod(labels={keys.KOORDINATOR_RESERVATION_IGNORED: "true"}), NS)


def test_taints_are_tolerated_through_the_affinity_tolerations_only() -> None:
    tainted = koord("r", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                                 {"key": "soft", "effect": "PreferNoSchedule"}])
    assert not may_use(tainted, pod(), NS)
    tolerating = json.dumps({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}]})
    assert may_use(tainted, pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: tolerating}), NS)
    wrong = json.dumps({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web"}]})
    assert not may_use(tainted, pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: wrong}), NS)


def test_tolerating_is_not_owning() -> None:
    tainted = koord("r", owners=[{"object": {"namespace": "team-b"}}], taints=[{"key": "t", "effect": "NoSchedule"}])
    tolerating = json.dumps({"tolerations": [{"operator": "Exists"}]})
    assert not may_use(tainted, pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: tolerating}), NS)


# --- the Koordinator source of the one model (shared.views, shared.kinds) ---

def test_keys_of_the_two_sources_cannot_collide() -> None:
    ours = ReservationView.from_obj({"metadata": {"name": "r"}, "spec": {"template": {"spec": {}}}})
    theirs = koord("r")
    assert (ours.key, theirs.key) == ("r", "scheduling.koordinator.sh/r")
    assert kinds.by_koordinator_key({"metadata": {"name": "r"}}) == theirs.key
    assert reservation_owner_id(ours.key) != reservation_owner_id(theirs.key)
    assert theirs.source == KOORDINATOR_SOURCE and theirs.api_version == keys.KOORDINATOR_API_VERSION


def test_expires_is_checked_before_the_defaulted_ttl_and_ttl_zero_never_expires() -> None:
    at = NOW + timedelta(minutes=5)
    assert expiry(koord("r", expires=stamp(at))) == at, "ttl 24h defaulted beside it"
    assert expiry(koord("r")) == NOW - timedelta(minutes=1) + timedelta(hours=24)
    assert expiry(koord("r", ttl="0s")) is None and expiry(koord("r", ttl="0")) is None


def test_reservation_order_label() -> None:
    assert koord("r", labels={keys.KOORDINATOR_RESERVATION_ORDER: "3"}).order == 3
    assert koord("r", labels={keys.KOORDINATOR_RESERVATION_ORDER: "soon"}).order == 0
    assert koord("r").order == 0


def test_a_second_writer_is_the_last_status_manager_that_is_not_reservoir() -> None:
    def entry(manager: str, time: str, subresource: str = "status") -> dict[str, Any]:
        return {"manager": manager, "operation": "Update", "subresource": subresource, "time": time}
    assert koord("r").second_writer == ""
    ours = [entry("kubectl", "2026-11-23T10:00:00Z", ""), entry(keys.KOORDINATOR_FIELD_MANAGER, "2026-11-23T10:01:00Z")]
    assert koord("r", managed=ours).second_writer == ""
    theirs = [*ours, entry("koord-scheduler", "2026-11-23T10:02:00Z")]
    assert koord("r", managed=theirs).second_writer == "koord-scheduler"
    assert ReservationView.from_obj({"metadata": {"name": "r", "managedFields": theirs},
                                     "spec": {"template": {"spec": {}}}}).second_writer == "", "Reservoir's own"


# --- the planner: one model, two sources ---

def cluster_with(*reservations: ReservationView, pods: tuple[dict[str, Any], ...] = ()) -> Cluster:
    cluster = Cluster.of(node_obj("n1", cpu="8"), pods=pods)
    cluster.reservations = {r.key: r for r in reservations}
    return cluster


def test_same_names_in_both_groups_are_two_reservations_each_with_its_placeholder() -> None:
    ours = ReservationView.from_obj({"metadata": {"name": "r", "uid": "uid-ours", "creationTimestamp": stamp(NOW)},
                                     "spec": {"owners": [{"object": {"namespace": NS}}], "template": {"spec": {
                                         "nodeName": "n1", "containers": [{"name": "r", "resources": {
                                             "requests": {"cpu": "1"}}}]}}}})
    cluster = cluster_with(ours, koord("r", phase=""))
    cluster.reconcile()
    cluster.reconcile()
    assert cluster.last is not None
    statuses = {s.name: s for s in cluster.last.reservations}
    assert set(statuses) == {"r", "scheduling.koordinator.sh/r"}
    assert statuses["scheduling.koordinator.sh/r"].api_version == keys.KOORDINATOR_API_VERSION
    assert statuses["scheduling.koordinator.sh/r"].object_name == "r"
    owners = {p["metadata"]["labels"][keys.PLACEHOLDER]: p for p in cluster.pods.values()
              if keys.PLACEHOLDER in p["metadata"].get("labels", {})}
    assert set(owners) == {reservation_owner_id("r"), reservation_owner_id("scheduling.koordinator.sh/r")}
    ref = owners[reservation_owner_id("scheduling.koordinator.sh/r")]["metadata"]["ownerReferences"][0]
    assert (ref["apiVersion"], ref["name"], ref["uid"]) == (keys.KOORDINATOR_API_VERSION, "r", "k-r")


def test_an_owner_is_handed_over_and_annotated_in_both_forms() -> None:
    k = koord("k", phase="", cpu="3", owners=[{"object": {"namespace": "ns"}}])
    cluster = cluster_with(k)
    cluster.reconcile()
    cluster.reconcile()
    assert cluster.reservations[k.key].phase == "Available"
    cluster.add(pod_obj("owner", "3", gated=True))
    annotate: list[tuple[str, ...]] = []
    for _ in range(4):
        cluster.reconcile()
        assert cluster.last is not None
        annotate += [s.annotate for s in cluster.last.reservations if s.annotate]
    assert cluster.pods["ns/owner"]["spec"]["nodeName"] == "n1"
    assert cluster.reservations[k.key].phase == "Succeeded"
    assert ("ns/owner",) in annotate
    # once it carries both forms, nothing is left to annotate
    cluster.pods["ns/owner"]["metadata"]["annotations"] = {
        keys.RESERVATION_ALLOCATED: k.key, keys.KOORDINATOR_RESERVATION_ALLOCATED: koordinator_allocated("k", "k-k")}
    from agent.planner.reservations import allocated_to
    from shared.views import PodView
    assert allocated_to(PodView.from_obj(cluster.pods["ns/owner"]), k)
    assert not allocated_to(PodView.from_obj(pod_obj("other", "1")), k)


def claimed_by(*reservations: ReservationView) -> str:
    """The key of the Reservation a 1-cpu owner is claimed for, among these (all Available on n1)."""
    cluster = cluster_with(*reservations)
    cluster.reconcile()
    cluster.reconcile()
    assert all(r.phase == "Available" for r in cluster.reservations.values())
    cluster.add(pod_obj("owner", "1", gated=True))
    cluster.reconcile(bind=False)
    assert cluster.last is not None
    [key] = [s.name for s in cluster.last.reservations if [p.name for p in s.owners] == ["owner"]]
    return key


def test_reservation_order_prefers_the_lowest_non_zero_order_then_most_allocated() -> None:
    owners = [{"object": {"namespace": "ns"}}]

    def big(order: str = "") -> ReservationView:
        return koord("big", cpu="2", owners=owners, phase="", age=timedelta(minutes=3),
                     labels={keys.KOORDINATOR_RESERVATION_ORDER: order} if order else {})

    def small(order: str = "") -> ReservationView:
        return koord("small", cpu="1", owners=owners, phase="", age=timedelta(minutes=2),
                     labels={keys.KOORDINATOR_RESERVATION_ORDER: order} if order else {})
    assert claimed_by(big(), small()) == "scheduling.koordinator.sh/small", "MostAllocated: 1 of 1 beats 1 of 2"
    assert claimed_by(big("1"), small()) == "scheduling.koordinator.sh/big", "an order beats none"
    assert claimed_by(big("2"), small("1")) == "scheduling.koordinator.sh/small", "the lower order first"
    assert claimed_by(big("1"), small("2")) == "scheduling.koordinator.sh/big"


def test_a_reservation_another_manager_writes_is_left_alone() -> None:
    managed = [{"manager": "koord-scheduler", "operation": "Update", "subresource": "status",
                "time": "2026-11-23T10:02:00Z"}]
    cluster = cluster_with(koord("theirs", managed=managed, phase="Available"))
    cluster.reconcile()
    assert cluster.last is not None
    [status] = cluster.last.reservations
    assert status.left_alone == "koord-scheduler" and status.final and not status.delete
    assert not cluster.placeholders() and cluster.last is not None and not cluster.last.locks
    assert any("decision=left-alone" in note for note in cluster.last.notes)


def test_the_lock_owner_event_names_the_koordinator_object() -> None:
    from agent.planner.model import Lock, Snapshot
    r = koord("k")
    lock = Lock(node="n1", owner=reservation_owner_id(r.key), kind=keys.LockKind.RESERVATION,
                subject=f"reservation/{r.key}", reason="x", since=NOW)
    target = owner_object(lock, Snapshot(nodes={}, pods=[], reservations={r.key: r}))
    assert target is not None and (target.name, target.api_version, target.uid) == (
        "k", keys.KOORDINATOR_API_VERSION, "k-k")


# --- the webhook ---

def lookup(*reservations: ReservationView) -> Lookup:
    return Lookup(reservations={r.key: r for r in reservations}, config=ReservoirConfig())


def gated(out: dict[str, Any]) -> bool:
    return any(g.get("name") == keys.HANDOVER_GATE for g in out["spec"].get("schedulingGates") or [])


def mutated(obj: dict[str, Any], where: Lookup) -> dict[str, Any]:
    from shared.jsonpatch import apply
    result = mutate_pod(obj, obj["metadata"]["namespace"], where)
    out: dict[str, Any] = apply(obj, result.patch)
    return out


def full_pod(name: str = "p", **meta: Any) -> dict[str, Any]:
    obj = pod(name, **meta)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": obj["metadata"],
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


def test_an_owner_through_a_namespace_only_object_is_gated_a_stranger_is_not() -> None:
    where = lookup(koord("r"))
    assert gated(mutated(full_pod(), where))
    assert not gated(mutated(full_pod(namespace="team-b"), where))


def test_a_reservation_ignored_pod_gets_no_gate_no_toleration_no_required_affinity() -> None:
    where = lookup(koord("r"))
    out = mutated(full_pod(labels={keys.KOORDINATOR_RESERVATION_IGNORED: "true"},
                           annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: '{"name": "r"}'}), where)
    r = reservation_owner_id(koord("r").key)
    assert not gated(out) and r not in str(out["spec"].get("tolerations")) and r not in str(out["spec"])
    assert gated(mutated(full_pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: '{"name": "r"}'}), where))


def test_selector_terms_narrow_to_the_koordinator_reservation_and_naming_is_not_owning() -> None:
    where = lookup(koord("r", labels={"pool": "gpu"}), koord("s", owners=[{"object": {"namespace": "team-b"}}]))
    terms = json.dumps({"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}})
    out = mutated(full_pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: terms}), where)
    required = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": keys.LOCK, "operator": "In", "values": [reservation_owner_id("scheduling.koordinator.sh/r")]}]
    assert gated(out)
    only_s = lookup(koord("s", owners=[{"object": {"namespace": "team-b"}}]))
    stranger = mutated(full_pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: '{"name": "s"}'}), only_s)
    s_owner = reservation_owner_id("scheduling.koordinator.sh/s")
    assert not gated(stranger) and s_owner not in str(stranger["spec"].get("tolerations")), "named, not an owner"
    assert s_owner in str(stranger["spec"]["affinity"]["nodeAffinity"]), "narrowed to it, and waits for it"


def test_a_tainted_reservation_gates_only_the_pods_tolerating_it() -> None:
    where = lookup(koord("r", taints=[{"key": "t", "effect": "NoSchedule"}]))
    assert not gated(mutated(full_pod(), where))
    tolerating = json.dumps({"tolerations": [{"key": "t", "operator": "Exists"}]})
    assert gated(mutated(full_pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: tolerating}), where))


def test_a_reservation_left_alone_gates_nobody() -> None:
    managed = [{"manager": "koord-scheduler", "operation": "Update", "subresource": "status",
                "time": "2026-11-23T10:02:00Z"}]
    assert not gated(mutated(full_pod(), lookup(koord("r", managed=managed))))


def test_ttl_beside_expires_is_let_in_and_ignored_fields_are_warned_about() -> None:
    body = {"metadata": {"name": "r", "labels": {keys.KOORDINATOR_RESERVATION_ORDER: "first"}}, "spec": {
        "owners": [{"controller": JOB_REF}, {"object": {"kind": "Pod"}}],
        "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
        "ttl": "24h", "expires": "2026-12-01T00:00:00Z", "preAllocationPolicy": {"mode": "Default"},
        "taints": [{"key": "t", "effect": "PreferNoSchedule"}]}}
    verdict = validate_reservation(body)
    assert verdict.allowed
    text = "\n".join(verdict.warnings)
    for field in ("spec.owners[0].controller.namespace", "spec.owners[1].object", "spec.preAllocationPolicy",
                  "spec.taints[0].effect", keys.KOORDINATOR_RESERVATION_ORDER):
        assert field in text, field


def test_a_koordinator_reservation_is_warned_about_never_refused() -> None:
    bad = {"metadata": {"name": "r"}, "spec": {"owners": [], "template": {"spec": {"containers": []}}}}
    assert not validate_reservation(bad).allowed
    verdict = validate_reservation(bad, koordinator=True)
    assert verdict.allowed and any("spec.owners is empty" in w for w in verdict.warnings)


def test_pod_side_keys_reservoir_ignores_are_warned_about() -> None:
    obj = full_pod(labels={keys.KOORDINATOR_PRE_ALLOCATION_REQUIRED: "true"}, annotations={
        keys.KOORDINATOR_RESTRICTED_OPTIONS: '{"resources": ["cpu"]}', keys.KOORDINATOR_EXACT_MATCH: "{}",
        keys.KOORDINATOR_RESERVATION_AFFINITY: '{"name": "r", "preferredDuringScheduling": []}'})
    verdict = validate_pod(obj)
    assert verdict.allowed
    text = "\n".join(verdict.warnings)
    for key in (keys.KOORDINATOR_PRE_ALLOCATION_REQUIRED, keys.KOORDINATOR_RESTRICTED_OPTIONS,
                keys.KOORDINATOR_EXACT_MATCH, "preferredDuringScheduling"):
        assert key in text, key


def test_many_ignored_affinity_keys_are_one_warning() -> None:
    """Review finding L2: an affinity of 300 unknown keys is one short warning, not 300."""
    text = json.dumps({"name": "r", **{f"k{i:03d}": 1 for i in range(300)}})
    verdict = validate_pod(full_pod(annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: text}))
    mentions = [w for w in verdict.warnings if "ignored by Reservoir" in w]
    assert verdict.allowed and len(mentions) == 1
    assert "'k000'" in mentions[0] and "and 295 more are ignored" in mentions[0] and len(mentions[0]) < 400


def test_an_affinity_is_read_once_per_text() -> None:
    """Review finding L3: the planner reads every owner's affinity on every plan; the same text is parsed once."""
    text = '{"name": "cached-once", "reservationSelector": {"a": "b"}}'
    assert parse_reservation_affinity(text) is parse_reservation_affinity(text)


# --- the switch: config, kustomize component, Helm value ---

def test_the_switch_is_off_by_default() -> None:
    assert ReservoirConfig().koordinator.reservations is False
    assert load_config("koordinator: {reservations: true}").koordinator.reservations is True


def koordinator_rules(docs: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """(ClusterRoles granting scheduling.koordinator.sh, webhooks for that group)."""
    roles = {d["metadata"]["name"] for d in docs if d.get("kind") == "ClusterRole"
             for rule in d.get("rules") or [] if keys.KOORDINATOR_GROUP in rule.get("apiGroups", [])}
    hooks = {(h["name"], h["clientConfig"].get("service", {}).get("path", ""), h["failurePolicy"])
             for d in docs if d.get("kind", "").endswith("WebhookConfiguration") for h in d["webhooks"]
             for rule in h["rules"] if keys.KOORDINATOR_GROUP in rule["apiGroups"]}
    return roles, {f"{name} {path} {policy}" for name, path, policy in hooks}


EXPECTED = ({"reservoir-agent-koordinator", "reservoir-webhook-koordinator", "reservoir-status-koordinator"},
            {"koordinator-reservations.validate.reservoir.sh /validate/koordinator-reservations Ignore"})


def test_the_base_install_has_no_koordinator_rules_the_component_adds_them() -> None:
    assert koordinator_rules(kustomize(DEPLOY)) == (set(), set())
    assert koordinator_rules(kustomize(DEPLOY, ("koordinator",))) == EXPECTED


def test_the_chart_renders_the_same_behind_its_value() -> None:
    off = helm_template()
    assert off.returncode == 0, off.stderr
    assert koordinator_rules([d for d in yaml.safe_load_all(off.stdout) if d]) == (set(), set())
    on = helm_template("koordinator.reservations=true")
    assert on.returncode == 0, on.stderr
    docs = [d for d in yaml.safe_load_all(on.stdout) if d]
    assert koordinator_rules(docs) == EXPECTED
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == keys.CONFIGMAP_NAME]
    assert load_config(configmap["data"][keys.CONFIG_KEY]).koordinator.reservations is True
    assert (CHART / "files" / "koordinator-rbac.yaml").resolve() == DEPLOY / "components" / "koordinator" / "rbac.yaml"


def test_the_fixture_crd_is_koordinators_unchanged() -> None:
    here = DEPLOY.parent / "tests" / "fixtures" / "koordinator" / "scheduling.koordinator.sh_reservations.yaml"
    crd = yaml.safe_load(here.read_text())
    assert crd["spec"]["group"] == keys.KOORDINATOR_GROUP and crd["spec"]["names"]["plural"] == "reservations"
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["ttl"]["default"] == "24h" and "taints" in spec and "preAllocationPolicy" in spec


# --- the switched cache: followed only while the switch is on ---

async def test_a_switched_cache_runs_only_while_on_and_forgets_its_items_when_off() -> None:
    import asyncio

    from shared.switchedcache import SwitchedCache
    from shared.watchcache import WatchCache

    obj = {"apiVersion": keys.KOORDINATOR_API_VERSION, "kind": "Reservation",
           "metadata": {"name": "r", "uid": "k-r", "resourceVersion": "1"},
           "spec": {"template": {"spec": {}}, "owners": [{"object": {"namespace": NS}}]}}
    runs: list[str] = []

    class Listed(WatchCache[Any]):
        """A cache whose list+watch is one fixed list (the API itself is the e2e tests' part)."""

        async def run(self) -> None:
            runs.append("run")
            self._replace([obj])
            self.synced.set()
            await asyncio.Event().wait()

    watched = kinds.KOORDINATOR_RESERVATIONS
    switched = SwitchedCache(Listed(None, watched.name, watched.path, watched.convert, key=watched.key))  # type: ignore[arg-type]
    assert not switched.on and switched.synced and dict(switched.items) == {}
    switched.switch(True)
    assert not switched.synced, "on and not listed yet: readers wait"
    await asyncio.sleep(0)
    assert switched.synced and list(switched.items) == ["scheduling.koordinator.sh/r"]
    switched.switch(True)
    await asyncio.sleep(0)
    assert runs == ["run"], "switching on twice starts one watch"
    switched.switch(False)
    assert not switched.on and switched.synced and dict(switched.items) == {}
    assert dict(switched.cache.items) == {}, "forgotten, not only hidden"
    await switched.stop()
