"""RFC 6902 JSON Patch operations with RFC 6901 pointer escaping (`~` -> `~0`, `/` -> `~1`)."""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(str(token)) for token in tokens)


def add(path: str, value: Any) -> Op:
    return {"op": "add", "path": path, "value": value}


def apply(document: Any, ops: list[Op]) -> Any:
    """Apply `add`, `remove` and `test` operations to a JSON document; enough to check a patch and its idempotency,
    and what `reservoir simulate` does for the API server. A failed `test` raises ValueError, as kube-apiserver
    refuses the whole patch.

    `document` is never changed. The result is a new document that shares with it every part the patch does not
    change: each dict and list on the path of an `add` or `remove` is copied (once, shallowly) before it is changed,
    and each value added is a deep copy (`copied`). A whole deep copy of a pod for each patch was most of the cost
    of patching in `reservoir simulate`; a caller changing the result in place must copy what it changes the same
    way."""
    doc = document
    fresh: set[int] = set()  # the containers this call made: changed in place, never copied again

    def own(value: Any) -> Any:
        if id(value) in fresh or not isinstance(value, dict | list):
            return value
        made = dict(value) if isinstance(value, dict) else list(value)
        fresh.add(id(made))
        return made

    for op in ops:
        kind = op["op"]
        if kind not in ("add", "remove", "test"):
            raise ValueError(f"unsupported op {kind!r}")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        last = tokens[-1]
        if kind == "test":
            target = doc
            for token in tokens[:-1]:
                target = target[int(token)] if isinstance(target, list) else target[token]
            if (target[int(last)] if isinstance(target, list) else target.get(last)) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
            continue
        doc = target = own(doc)
        for token in tokens[:-1]:
            at: int | str = int(token) if isinstance(target, list) else token
            child = own(target[at])
            target[at] = child
            target = child
        if kind == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif isinstance(target, list):
            if last == "-":
                target.append(copied(op["value"]))
            else:
                target.insert(int(last), copied(op["value"]))
        else:
            target[last] = copied(op["value"])
    return doc if doc is not document else own(document)


def copied(value: Any) -> Any:
    """A deep copy of a JSON value: its dicts and lists new, its scalars (immutable) shared; a few times cheaper than
    copy.deepcopy, which keeps a memo of every object for cycles JSON cannot have."""
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copied(item) for item in value]
    if isinstance(value, tuple):  # our own patches may carry tuples (of tolerations): copied, still tuples
        return tuple(copied(item) for item in value)
    return value
