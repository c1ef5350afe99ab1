"""A Reservation owner a tenant can satisfy by naming (shared.matching): the namespace-less `controller` entry and
the `object` entry with a name alone match no pod, since any tenant can create a pod of any name with any
ownerReference in its own namespace; a namespace, or a uid the API server assigned, confines them."""
from __future__ import annotations

import pytest

from shared.matching import owner_matches


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
