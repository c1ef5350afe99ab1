"""shared.jsonpatch.apply: RFC 6902's add, remove and test over a document it never changes, sharing what a patch
does not change."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.jsonpatch import Op, apply, pointer


def reference(document: Any, ops: list[Op]) -> Any:
    """The same operations on a whole deep copy, changed in place: what apply did before it shared."""
    doc = copy.deepcopy(document)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target = doc
        for token in tokens[:-1]:
            target = target[int(token)] if isinstance(target, list) else target[token]
        last = tokens[-1]
        if op["op"] == "test":
            if (target[int(last)] if isinstance(target, list) else target.get(last)) != op["value"]:
                raise ValueError("test failed")
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            target[last] = copy.deepcopy(op["value"])
    return doc


def pod() -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": {"a": "1"}, "annotations": {"x/y": "2"}},
            "spec": {"tolerations": [{"key": "k"}], "containers": [{"name": "c", "resources": {"requests": {}}}]},
            "status": {"phase": "Pending"}}


def test_the_document_is_never_changed_and_what_the_patch_leaves_is_shared() -> None:
    document = pod()
    before = copy.deepcopy(document)
    ops = [{"op": "add", "path": pointer("metadata", "annotations", "x/z"), "value": {"deep": [1]}},
           {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "lock"}},
           {"op": "remove", "path": "/metadata/labels/a"}]
    result = apply(document, ops)
    assert document == before, "the input unchanged"
    assert result["metadata"]["annotations"] == {"x/y": "2", "x/z": {"deep": [1]}}
    assert result["spec"]["tolerations"] == [{"key": "k"}, {"key": "lock"}] and result["metadata"]["labels"] == {}
    assert result["status"] is document["status"] and result["spec"]["containers"] is document["spec"]["containers"]
    assert result["spec"]["tolerations"][0] is document["spec"]["tolerations"][0], "an element not changed, shared"
    for path in (("metadata",), ("metadata", "annotations"), ("spec",), ("spec", "tolerations")):
        changed, original = result, document
        for token in path:
            changed, original = changed[token], original[token]
        assert changed is not original, f"{path} was changed: copied"
    assert result["metadata"]["annotations"]["x/z"] is not ops[0]["value"], "a value added is a copy of the op's"


def test_a_patch_that_changes_nothing_still_gives_a_new_document() -> None:
    document = pod()
    result = apply(document, [{"op": "test", "path": "/metadata/name", "value": "p"}])
    assert result == document and result is not document
    with pytest.raises(ValueError, match="test failed at /metadata/name"):
        apply(document, [{"op": "add", "path": "/metadata/labels/b", "value": "3"},
                         {"op": "test", "path": "/metadata/name", "value": "q"}])
    assert document == pod(), "a refused patch changed nothing"


def test_an_unsupported_op_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported op 'replace'"):
        apply(pod(), [{"op": "replace", "path": "/metadata/name", "value": "q"}])


keys = st.sampled_from(["a", "b", "c~/"])
values = st.recursive(st.integers(0, 3) | st.text(max_size=2),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=8)
documents = st.dictionaries(keys, values, min_size=1, max_size=3)


def container(document: Any, draw: Any) -> tuple[list[str | int], Any]:
    """A dict or list in `document`, and the tokens of its path."""
    tokens: list[str | int] = []
    target = document
    while True:
        inner = [k for k, v in (target.items() if isinstance(target, dict) else enumerate(target))
                 if isinstance(v, dict | list)]
        if not inner or draw(st.booleans()):
            return tokens, target
        token = draw(st.sampled_from(inner))
        tokens.append(token)
        target = target[token]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), document=documents)
def test_any_patch_gives_what_a_whole_copy_changed_in_place_gives(data: Any, document: dict[str, Any]) -> None:
    """Random add, remove and test operations on random documents: the same result as on a deep copy, the input
    unchanged, and a test that fails (or a path that is not there) refuses the patch as before."""
    before = copy.deepcopy(document)
    ops: list[Op] = []
    current = copy.deepcopy(document)
    for _ in range(data.draw(st.integers(1, 4))):
        tokens, target = container(current, data.draw)
        kind = data.draw(st.sampled_from(["add", "remove", "test"]))
        there: list[str | int] = list(target) if isinstance(target, dict) else list(range(len(target)))
        if isinstance(target, dict):
            key: str | int = data.draw(st.sampled_from(there) | keys) if there else data.draw(keys)
        elif kind == "add":
            key = data.draw(st.sampled_from([*range(len(target) + 1), "-"]))
        else:
            key = data.draw(st.sampled_from(there)) if there else 0
        op: Op = {"op": kind, "path": pointer(*tokens, key)}
        if kind != "remove":
            op["value"] = data.draw(values)
        ops.append(op)
        try:
            current = reference(current, [op])
        except (ValueError, KeyError, IndexError):
            pass
    try:
        expected: Any = reference(document, ops)
    except (ValueError, KeyError, IndexError) as err:
        expected = type(err)
    try:
        got: Any = apply(document, ops)
    except (ValueError, KeyError, IndexError) as err:
        got = type(err)
    assert got == expected
    assert document == before
