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
    """Apply `add`, `remove` and `test` operations to a JSON document (a copy); enough to check a patch and its
    idempotency. A failed `test` raises ValueError, as kube-apiserver refuses the whole patch."""
    import copy

    doc = copy.deepcopy(document)
    for op in ops:
        if op["op"] not in ("add", "remove", "test"):
            raise ValueError(f"unsupported op {op['op']!r}")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target = doc
        for token in tokens[:-1]:
            target = target[int(token)] if isinstance(target, list) else target[token]
        last = tokens[-1]
        if op["op"] == "test":
            if (target[int(last)] if isinstance(target, list) else target.get(last)) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
            continue
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
            continue
        if isinstance(target, list):
            if last == "-":
                target.append(copy.deepcopy(op["value"]))
            else:
                target.insert(int(last), copy.deepcopy(op["value"]))
        else:
            target[last] = copy.deepcopy(op["value"])
    return doc
