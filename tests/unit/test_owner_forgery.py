"""A Reservation owner a tenant can satisfy by naming (shared.matching): the namespace-less `controller` entry and
the `object` entry with a name alone match no pod, since any tenant can create a pod of any name with any
ownerReference in its own namespace; a namespace, or a uid the API server assigned, confines them."""
from __future__ import annotations

import pytest

from shared.matching import owner_matches
from shared.ownership import JobRef, job_identity


def pod(name: str, uid: str = "uid-1") -> dict:
    return {"metadata": {"name": name, "uid": uid,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j-1",
                                              "controller": True}]}}


@pytest.mark.parametrize(("owner", "namespace", "matches"), [
    ({"object": {"name": "trainer"}}, "team-a", False),  # a name alone: any namespace's pod of that name
    ({"object": {"name": "trainer"}}, "team-b", False),
    ({"object": {"name": "trainer", "namespace": "team-a"}}, "team-a", True),
    ({"object": {"name": "trainer", "namespace": "team-a"}}, "team-b", False),
    ({"object": {"namespace": "team-a"}}, "team-a", True),  # a namespace alone: every pod of it
    ({"object": {"uid": "uid-1"}}, "team-b", True),  # a uid is the API server's: unforgeable
    ({"object": {"name": "trainer", "uid": "uid-2"}}, "team-a", False),
    ({"object": {"name": "trainer", "kind": "Pod", "apiVersion": "v1"}}, "team-a", False),
    ({"controller": {"name": "train", "kind": "Job"}}, "team-a", False),  # the namespace-less controller, as before
    ({"controller": {"name": "train", "kind": "Job", "namespace": "team-a"}}, "team-a", True),
])
def test_an_owner_matches_only_what_a_tenant_cannot_forge_from_another_namespace(
        owner: dict, namespace: str, matches: bool) -> None:
    assert owner_matches(owner, pod("trainer"), namespace) is matches


def test_a_name_alone_is_confined_by_the_same_entrys_controller_namespace() -> None:
    owner = {"object": {"name": "trainer"}, "controller": {"name": "train", "kind": "Job", "namespace": "team-a"}}
    assert owner_matches(owner, pod("trainer"), "team-a")
    assert not owner_matches(owner, pod("trainer"), "team-b")


@pytest.mark.parametrize("kind", ["prod~Job", "prod-Job", "job", "Prod/Job", "", "J" * 64, 7])
def test_a_controller_of_a_kind_no_object_has_is_no_job(kind: object) -> None:
    """A tenant in namespace `team` naming a controller of kind `prod~Job` would read as `team-prod-Job-train`, the
    readable part of namespace team-prod's Job/train lock owner id, leaving one 24-bit hash between them: a kind that
    is not CamelCase letters and digits is no job, the pod is its own (shared.ownership.CONTROLLER_KIND), for the
    webhook and the planner alike (both read job_identity)."""
    meta = {"name": "p", "ownerReferences": [{"kind": kind, "name": "train", "controller": True, "uid": "u"}]}
    assert job_identity(meta) == ("Pod", "p")


def test_owner_ids_of_two_namespaces_differ_in_their_readable_part_for_any_valid_kind() -> None:
    victim = JobRef("team-prod", "Job", "train").owner_id
    for kind in ("ProdJob", "Prod", "Job"):
        for name in ("train", "job-train", "prod-job-train"):
            meta = {"name": "p", "ownerReferences": [{"kind": kind, "name": name, "controller": True, "uid": "u"}]}
            ref = JobRef("team", *job_identity(meta))
            assert ref.owner_id.rsplit("-", 1)[0] != victim.rsplit("-", 1)[0], (kind, name)
    assert job_identity({"name": "p", "ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": True}]}) \
        == ("StatefulSet", "db")


@pytest.mark.parametrize("meta, expected", [
    ({"annotations": {"scheduling.k8s.io/group-name": "g" * 300_000}}, ("Pod", "p")),
    ({"annotations": {"scheduling.k8s.io/group-name": "Not A Name"}}, ("Pod", "p")),
    ({"annotations": {"scheduling.k8s.io/group-name": "x" * 254},
      "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}]}, ("Job", "j")),
    ({"ownerReferences": [{"kind": "Job", "name": "a" * 300_000, "controller": True}]}, ("Pod", "p")),
    ({"ownerReferences": [{"kind": "Job", "name": "a/b", "controller": True}]}, ("Pod", "p")),
    ({"ownerReferences": [{"kind": "Job", "name": "", "controller": True}]}, ("Pod", "p")),
    ({"annotations": {"scheduling.k8s.io/group-name": "my-job"}}, ("PodGroup", "my-job")),
    ({"ownerReferences": [{"kind": "Job", "name": "a" * 253, "controller": True}]}, ("Job", "a" * 253)),
], ids=["huge group", "group not a name", "group too long, controller", "huge controller", "controller with /",
        "empty controller", "a group", "the longest controller name"])
def test_a_name_no_object_can_have_names_no_job(meta: dict, expected: tuple[str, str]) -> None:
    """The pods /validate/pods never sees (labelled reservoir.sh/ignore, or made while it was down): a job named by a
    group annotation or controller no object can have is no job (the next rule, or the pod alone). Such a name went
    into the job's lock-info annotation, past the API server's 256 KiB, so the lock was planned at every plan and
    never written."""
    assert job_identity({"name": "p", **meta}) == expected
