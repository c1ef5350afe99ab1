from hypothesis import given
from hypothesis import strategies as st

from shared import keys
from shared.keys import LockKind, is_label_value, owner_id, owner_kind


def test_owner_id_shape() -> None:
    value = owner_id(LockKind.QUEUE, "research")
    assert value.startswith("queue-research-") and len(value) == len("queue-research-") + 6
    assert owner_kind(value) is LockKind.QUEUE
    assert owner_kind("somebody-else") is None


def test_long_names_are_cut_but_stay_distinct() -> None:
    a = owner_id(LockKind.JOB, keys.job_full_name("ns", "PodGroup", "x" * 100 + "a"))
    b = owner_id(LockKind.JOB, keys.job_full_name("ns", "PodGroup", "x" * 100 + "b"))
    assert len(a) == 63 and len(b) == 63 and a != b


@given(st.sampled_from(list(LockKind)), st.text(min_size=0, max_size=300))
def test_owner_id_is_always_a_label_value(kind: LockKind, name: str) -> None:
    value = owner_id(kind, name)
    assert is_label_value(value), value
    assert owner_kind(value) is kind
    assert owner_id(kind, name) == value  # deterministic
