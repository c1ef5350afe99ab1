"""Issue 13, "Works with Volcano's real CRDs": the Queue annotations that stand in for the fields Volcano's Queue schema
does not declare (kube-apiserver prunes them), read by shared.views.QueueView and checked by the webhook as the fields
are; the spec field wins when both are set; a malformed annotation is a ViewError (the caches skip the Queue) or a
denial naming the annotation, the value and the fix, never a crash."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agent.planner.ordering import queue_priority
from shared import keys
from shared.resources import Resources
from shared.views import MAX_ANNOTATION_JSON, PriorityClassView, QueueView, ViewError, parse_percentage_annotation
from webhook.validate import judge_update, validate_queue

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "volcano"  # Volcano's CRDs, copied unchanged
HALF = '{"dimensions": ["cpu", "memory"], "value": 0.5}'


def queue(annotations: dict[str, Any] | None = None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "q1", "annotations": dict(annotations or {})}, "spec": dict(spec or {})}


# --- the field diff: what Volcano's schemas lack, and nothing else ---

def _declared(crd: dict[str, Any]) -> set[str]:
    """Every property path the CRD's schema declares (`spec.guarantee.resource`)."""
    out: set[str] = set()
    stack = [("", crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])]
    while stack:
        prefix, node = stack.pop()
        for name, child in (node.get("properties") or {}).items():
            out.add(prefix + name)
            stack.append((prefix + name + ".", child))
    return out


# every Queue and PodGroup field Reservoir reads (shared.views QueueView / PodGroupView, the webhook's validators),
# with the annotation standing in for it where Volcano's schema lacks it
QUEUE_FIELDS = {
    "spec.weight": None, "spec.priority": None, "spec.capability": None, "spec.deserved": None,
    "spec.guarantee.resource": None, "status.reservation.nodes": None, "status.reservation.resource": None,
    "spec.priorityClassName": keys.QUEUE_PRIORITY_CLASS,
    "spec.guarantee.policy": keys.QUEUE_GUARANTEE_POLICY,
    "spec.guarantee.percentage": keys.QUEUE_GUARANTEE_PERCENTAGE,
}
PODGROUP_FIELDS = ("spec.minMember", "spec.queue", "spec.priorityClassName", "spec.minResources")


def test_every_field_volcano_lacks_has_an_annotation_and_no_other_does() -> None:
    queues = _declared(yaml.safe_load((FIXTURES / "scheduling.volcano.sh_queues.yaml").read_text()))
    podgroups = _declared(yaml.safe_load((FIXTURES / "scheduling.volcano.sh_podgroups.yaml").read_text()))
    assert {path for path, key in QUEUE_FIELDS.items() if key} == {path for path in QUEUE_FIELDS if path not in queues}
    assert all(path in podgroups for path in PODGROUP_FIELDS), "a PodGroup field Volcano lacks needs an annotation"


# --- reading (shared.views) ---

def test_a_volcano_queue_reads_its_guarantee_from_the_annotations() -> None:
    """Volcano's schema keeps `spec.guarantee.resource` and prunes policy and percentage: the annotations fill them."""
    view = QueueView.from_obj(queue({keys.QUEUE_GUARANTEE_POLICY: "Guaranteed", keys.QUEUE_LOCK_GUARANTEE: "true",
                                     keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu", "gpu"], "value": 0.29}'},
                                    {"guarantee": {"resource": {"cpu": "4"}}}))
    assert view.guarantee is not None
    assert view.guarantee.policy == "Guaranteed" and view.locks_exclusively
    assert view.guarantee.resource == Resources.parse({"cpu": "4"})
    assert view.guarantee.percentage_dimensions == ("cpu", "gpu")
    assert view.guarantee.percentage_value == Fraction(29, 100), "exact, as the field is read"


def test_annotations_alone_make_a_guarantee() -> None:
    only_percentage = QueueView.from_obj(queue({keys.QUEUE_GUARANTEE_PERCENTAGE: HALF}))
    assert only_percentage.guarantee is not None and only_percentage.guarantee.policy == "Best-Effort"
    assert only_percentage.guarantee.percentage_value == Fraction(1, 2)
    assert QueueView.from_obj(queue({keys.QUEUE_GUARANTEE_POLICY: "Guaranteed"})).guarantee is not None, \
        "as spec.guarantee.policy alone makes one (the webhook refuses both)"
    assert QueueView.from_obj(queue({keys.QUEUE_GUARANTEE_PERCENTAGE: "{}"})).guarantee is None, "as percentage: {}"


def test_the_spec_field_wins_over_its_annotation() -> None:
    view = QueueView.from_obj(queue(
        {keys.QUEUE_GUARANTEE_POLICY: "Guaranteed", keys.QUEUE_PRIORITY_CLASS: "from-annotation",
         keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["memory"], "value": 0.9}'},
        {"priorityClassName": "from-spec",
         "guarantee": {"policy": "Best-Effort", "percentage": {"dimensions": ["cpu"], "value": 0.25}}}))
    assert view.class_name == "from-spec"
    assert view.guarantee is not None and view.guarantee.policy == "Best-Effort"
    assert (view.guarantee.percentage_dimensions, view.guarantee.percentage_value) == (("cpu",), Fraction(1, 4))


def test_a_spec_percentage_hides_a_malformed_annotation_from_the_reader() -> None:
    """The annotation is not read when the field wins (the webhook still refuses it: a later edit could expose it)."""
    view = QueueView.from_obj(queue({keys.QUEUE_GUARANTEE_PERCENTAGE: "{oops"},
                                    {"guarantee": {"percentage": {"dimensions": ["cpu"], "value": 0.5}}}))
    assert view.guarantee is not None and view.guarantee.percentage_value == Fraction(1, 2)


def test_empty_annotations_count_as_absent() -> None:
    view = QueueView.from_obj(queue({keys.QUEUE_GUARANTEE_POLICY: "", keys.QUEUE_GUARANTEE_PERCENTAGE: "",
                                     keys.QUEUE_PRIORITY_CLASS: ""}))
    assert view.guarantee is None and view.class_name == ""


def test_the_priority_class_annotation_orders_queues() -> None:
    """Seed 001 QueueScoreOrder: the annotation's class gives the queue its priority, as spec.priorityClassName does."""
    classes = {"gold": PriorityClassView("gold", 1000, False, "PreemptLowerPriority")}
    assert queue_priority(QueueView.from_obj(queue({keys.QUEUE_PRIORITY_CLASS: "gold"})), classes) == 1000
    assert queue_priority(QueueView.from_obj(queue({keys.QUEUE_PRIORITY_CLASS: "gold"}, {"priority": 7})),
                          classes) == 1000
    assert queue_priority(QueueView.from_obj(queue({keys.QUEUE_PRIORITY_CLASS: "missing"}, {"priority": 7})),
                          classes) == 7


@pytest.mark.parametrize(("text", "says"), [
    ("{oops", "not JSON"),
    ("0.5", "not a JSON object"),
    ('["cpu"]', "not a JSON object"),
    ('{"dimensions": ["cpu"], "value": NaN}', "NaN is not a JSON number"),
    ('{"dimensions": ["cpu"], "value": Infinity}', "Infinity is not a JSON number"),
    ("[" * 3000 + "]" * 3000, "longer than"),
    ("[" * 2000 + "]" * 2000, "nested too deep"),
    ("x" * (MAX_ANNOTATION_JSON + 1), "longer than"),
])
def test_unreadable_percentage_text_is_refused_with_the_form(text: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_percentage_annotation(text)
    assert says in str(err.value) and '{"dimensions": ["cpu", "memory"], "value": 0.5}' in str(err.value)


@pytest.mark.parametrize(("text", "field"), [
    ("{oops", 'metadata.annotations["reservoir.sh/guarantee-percentage"]: \'{oops\' is not JSON'),
    ('{"dimensions": ["cpu"], "value": "half"}',
     'metadata.annotations["reservoir.sh/guarantee-percentage"].value: expected a number'),
    ('{"dimensions": ["cpu"], "value": 1e999}', '.value: expected a number'),
    ('{"dimensions": "cpu", "value": 0.5}', '"].dimensions: expected a list'),
    ('{"dimensions": [1, 2], "value": 0.5}', '"].dimensions: expected a list of strings'),
    ('{"dimensions": ["cpu"], "value": 0.5, "x": [[[[1]]]]}', None),  # unknown keys: ignored by the reader
])
def test_a_malformed_percentage_annotation_makes_the_queue_unreadable_naming_it(text: str, field: str | None) -> None:
    obj = queue({keys.QUEUE_GUARANTEE_PERCENTAGE: text})
    if field is None:
        assert QueueView.from_obj(obj).guarantee is not None
        return
    with pytest.raises(ViewError) as err:
        QueueView.from_obj(obj)
    assert str(err.value).startswith("Queue q1: ") and field in str(err.value), str(err.value)
    assert err.value.kind == "Queue"


@given(st.dictionaries(st.sampled_from([keys.QUEUE_GUARANTEE_POLICY, keys.QUEUE_GUARANTEE_PERCENTAGE,
                                        keys.QUEUE_PRIORITY_CLASS, keys.QUEUE_LOCK_GUARANTEE]),
                       st.one_of(st.text(max_size=60),
                                 st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                                              lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                                              max_leaves=10).map(json.dumps))))
def test_any_annotation_value_reads_or_is_a_view_error_and_the_webhook_answers(annotations: dict[str, str]) -> None:
    """A hostile tenant can write any string: the reader returns a view or raises ViewError, the webhook a verdict."""
    obj = queue(annotations, {"guarantee": {"resource": {"cpu": "1"}}})
    try:
        QueueView.from_obj(obj)
    except ViewError:
        pass
    verdict = validate_queue(obj)
    assert verdict.allowed or verdict.message.startswith("Queue q1: ")


# --- validating (webhook.validate.validate_queue) ---

def test_good_annotations_are_admitted() -> None:
    verdict = validate_queue(queue({keys.QUEUE_GUARANTEE_POLICY: "Guaranteed", keys.QUEUE_GUARANTEE_PERCENTAGE: HALF,
                                    keys.QUEUE_PRIORITY_CLASS: "high-priority", keys.QUEUE_LOCK_GUARANTEE: "true"},
                                   {"guarantee": {"resource": {"cpu": "2"}}}))
    assert verdict.allowed and verdict.warnings == [], verdict
    assert validate_queue(queue({keys.QUEUE_GUARANTEE_POLICY: "Best-Effort",
                                 keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["gpu"], "value": 1}',
                                 keys.QUEUE_LOCK_GUARANTEE: "true"})).allowed


@pytest.mark.parametrize(("annotations", "message"), [
    ({keys.QUEUE_GUARANTEE_POLICY: "guaranteed", keys.QUEUE_GUARANTEE_PERCENTAGE: HALF},
     'Queue q1: metadata.annotations["reservoir.sh/guarantee-policy"] is \'guaranteed\': expected Best-Effort or '
     'Guaranteed'),
    ({keys.QUEUE_GUARANTEE_POLICY: "", keys.QUEUE_GUARANTEE_PERCENTAGE: HALF},
     '["reservoir.sh/guarantee-policy"] is \'\': expected Best-Effort or Guaranteed'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu"], "value": 1.5}'},
     'metadata.annotations["reservoir.sh/guarantee-percentage"].value is 1.5: expected a number in [0, 1]'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu"], "value": "0.5"}'},
     '["reservoir.sh/guarantee-percentage"].value is \'0.5\': expected a number in [0, 1]'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["gpus"], "value": 0.5}'},
     'metadata.annotations["reservoir.sh/guarantee-percentage"].dimensions: unknown resource name \'gpus\''),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"value": 0.5}'},
     '["reservoir.sh/guarantee-percentage"].dimensions is None: expected a non-empty list of resource names'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimension": ["cpu"], "value": 0.5}'},
     '["reservoir.sh/guarantee-percentage"] has unknown keys [\'dimension\']: expected only dimensions and value'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: "50%"},
     'metadata.annotations["reservoir.sh/guarantee-percentage"]: \'50%\' is not JSON'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: "cpu=0.5"}, 'expected a JSON object such as {"dimensions": ["cpu", "memory"], '
                                                   '"value": 0.5}'),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: "[" * 5000}, "is longer than 4096 characters"),
    ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu"], "value": NaN}'}, "NaN is not a JSON number"),
    ({keys.QUEUE_PRIORITY_CLASS: "High Priority"},
     'metadata.annotations["reservoir.sh/priority-class"] is \'High Priority\': expected the name of a PriorityClass'),
    ({keys.QUEUE_PRIORITY_CLASS: "x" * 300}, '["reservoir.sh/priority-class"] is'),
    ({keys.QUEUE_GUARANTEE_POLICY: "Guaranteed"},
     '["reservoir.sh/guarantee-policy"] sets a policy for no guarantee: it needs spec.guarantee.resource and/or a '
     'percentage'),
])
def test_bad_annotations_are_denied_naming_the_annotation_the_value_and_the_fix(annotations: dict[str, str],
                                                                                message: str) -> None:
    verdict = validate_queue(queue(annotations))
    assert not verdict.allowed and message in verdict.message, verdict.message
    assert len(verdict.message) < 2000, "a hostile value is quoted short"


def test_a_pruned_guarantee_is_told_where_the_percentage_goes() -> None:
    """`guarantee: {policy: ..., percentage: ...}` on Volcano's schema is stored as `guarantee: {}`: the denial points
    at the annotation."""
    verdict = validate_queue(queue(spec={"guarantee": {}}))
    assert not verdict.allowed and "spec.guarantee needs resource and/or percentage" in verdict.message
    assert keys.QUEUE_GUARANTEE_PERCENTAGE in verdict.message
    assert validate_queue(queue({keys.QUEUE_GUARANTEE_PERCENTAGE: HALF}, {"guarantee": {}})).allowed


def test_an_annotation_beside_its_field_is_let_in_with_a_warning_that_the_field_wins() -> None:
    verdict = validate_queue(queue(
        {keys.QUEUE_PRIORITY_CLASS: "low", keys.QUEUE_GUARANTEE_POLICY: "Guaranteed",
         keys.QUEUE_GUARANTEE_PERCENTAGE: HALF, keys.QUEUE_LOCK_GUARANTEE: "true"},
        {"priorityClassName": "high",
         "guarantee": {"policy": "Best-Effort", "percentage": {"dimensions": ["cpu"], "value": 0.5}}}))
    assert verdict.allowed
    joined = "\n".join(verdict.warnings)
    assert 'metadata.annotations["reservoir.sh/priority-class"] (\'low\') is ignored: spec.priorityClassName ' \
           "('high') is set and wins" in joined
    assert '["reservoir.sh/guarantee-policy"] (\'Guaranteed\') is ignored: spec.guarantee.policy' in joined
    assert '["reservoir.sh/guarantee-percentage"] is ignored: spec.guarantee.percentage is set and wins' in joined
    same = validate_queue(queue({keys.QUEUE_PRIORITY_CLASS: "high"}, {"priorityClassName": "high"}))
    assert same.allowed and same.warnings == [], "the same value twice is no conflict"


def test_a_malformed_annotation_is_denied_even_where_its_field_wins() -> None:
    verdict = validate_queue(queue({keys.QUEUE_GUARANTEE_PERCENTAGE: "{oops"},
                                   {"guarantee": {"percentage": {"dimensions": ["cpu"], "value": 0.5}}}))
    assert not verdict.allowed and "guarantee-percentage" in verdict.message


def test_an_annotation_only_guarantee_is_warned_until_it_opts_in() -> None:
    verdict = validate_queue(queue({keys.QUEUE_GUARANTEE_PERCENTAGE: HALF}))
    assert verdict.allowed and any(keys.QUEUE_LOCK_GUARANTEE in w for w in verdict.warnings)


def test_spec_priority_class_name_is_checked_as_its_annotation_is() -> None:
    verdict = validate_queue(queue(spec={"priorityClassName": "Gold!"}))
    assert not verdict.allowed and "spec.priorityClassName is 'Gold!': expected the name of a PriorityClass" \
        in verdict.message
    assert validate_queue(queue(spec={"priorityClassName": "gold.example-1"})).allowed


def test_an_update_that_leaves_a_bad_annotation_alone_is_let_through_with_a_warning() -> None:
    """As for fields (judge_update): a Queue admitted while the webhook was down can still be edited."""
    old = queue({keys.QUEUE_GUARANTEE_POLICY: "sometimes", keys.QUEUE_GUARANTEE_PERCENTAGE: HALF})
    new = queue({keys.QUEUE_GUARANTEE_POLICY: "sometimes", keys.QUEUE_GUARANTEE_PERCENTAGE: HALF,
                 keys.QUEUE_LOCK_GUARANTEE: "true"})
    verdict = judge_update(validate_queue(new), validate_queue(old))
    assert verdict.allowed and any("guarantee-policy" in w and "let through" in w for w in verdict.warnings)
