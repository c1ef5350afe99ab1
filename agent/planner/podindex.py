"""Issue 34: the pods as the planner reads them, indexed once and then kept up to date from what changed.

A plan used to walk every pod of the cluster several times (to group them by node, to find the pending ones and their
jobs, to look pods up by uid or name): at 150,000 pods each walk is tens of milliseconds, on every plan, whatever
changed. `PodIndex` holds those groupings; `PodIndex.of(pods)` builds it from scratch, and `updated(changed, removed)`
gives the index of the pods after a change, touching only the groups the changed pods were and are in. The full
build is the oracle: tests/unit/test_podindex.py drives random changes through both and requires equal indexes, and
plans from either.

Order. Every group (a node's pods, a job's pods) is in pod key order ("namespace/name"), whatever order the pods came
in: the full build and the update agree on it, and a plan does not depend on the order a watch delivered events (a
relist reorders them). Lookups (`pods`, `by_uid`, `unbound`) are mappings; what a reader must see in an order it
sorts itself.

An update makes new mappings and new tuples for the touched groups only: the index a plan was given is never changed
under it, and unchanged groups are the same tuples as before, so a reader can tell by identity what did not change
(capacity.node_states reuses such a node's state). The mappings as large as the cluster's pods (`pods`, `by_uid`,
`by_job`) are `Layered`: the new one shares the old one's base and carries the changes since, so one pod event does
not copy 150,000 entries (it did: 8 of a replan's 50 ms at 5,000 nodes); the small ones are shallow copies.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shared.views import TERMINAL, PodView

JobKey = tuple[str, str, str]  # PodView.job
K = TypeVar("K")
V = TypeVar("V")
_GONE: Any = object()  # in a Layered's changes: the key was removed
_ABSENT: Any = object()
LAYER_MIN = 1024  # a Layered folds its changes into a new base past max(LAYER_MIN, base / LAYER_FRACTION) of them
LAYER_FRACTION = 32


class Layered(Mapping[K, V], Generic[K, V]):
    """An immutable mapping as a base dict and the changes made since (a key -> its new value, or removed), both
    shared with the Layered it was made from and never changed: `with_changes` copies only the changes, and folds
    them into a new base once they pass 1/LAYER_FRACTION of it (so a lookup stays two dict probes, and an update
    costs the changes, with a copy of the base amortized over thousands of updates)."""

    __slots__ = ("_base", "_changes", "_len")

    def __init__(self, base: dict[K, V] | None = None) -> None:
        """`base` is handed over: nothing may change it after."""
        self._base: dict[K, V] = base if base is not None else {}
        self._changes: dict[K, V] = {}
        self._len = len(self._base)

    def __getitem__(self, key: K) -> V:
        value = self._changes.get(key, _ABSENT)
        if value is _ABSENT:
            return self._base[key]
        if value is _GONE:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def get(self, key: K, default: Any = None) -> Any:
        value = self._changes.get(key, _ABSENT)
        if value is _ABSENT:
            return self._base.get(key, default)
        return default if value is _GONE else value

    def __contains__(self, key: object) -> bool:
        value = self._changes.get(key, _ABSENT)  # type: ignore[arg-type]
        return key in self._base if value is _ABSENT else value is not _GONE

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        return iter(self._base) if not self._changes else self._merged()

    def _merged(self) -> Iterator[K]:
        changes = self._changes
        for key in self._base:
            if key not in changes:
                yield key
        for key, value in changes.items():
            if value is not _GONE:
                yield key

    def with_changes(self, changes: Mapping[K, V]) -> Layered[K, V]:
        """This mapping with `changes` (a value of _GONE removes its key; removing a key not here is a no-op)."""
        if not changes:
            return self
        length = self._len
        for key, value in changes.items():
            length += (value is not _GONE) - (key in self)
        out = Layered.__new__(Layered)
        merged = {**self._changes, **changes}
        if len(merged) > max(LAYER_MIN, len(self._base) // LAYER_FRACTION):
            base = dict(self._base)
            for key, value in merged.items():
                if value is _GONE:
                    base.pop(key, None)
                else:
                    base[key] = value
            out._base, out._changes = base, {}
        else:
            out._base, out._changes = self._base, merged
        out._len = length
        return out


def _by_key(pods: Iterable[PodView]) -> tuple[PodView, ...]:
    return tuple(sorted(pods, key=_key))


def as_index(pods: PodIndex | Iterable[PodView]) -> PodIndex:
    """`pods` when it is an index, else their index (PodIndex.of): for the planner functions tests call with a list."""
    return pods if isinstance(pods, PodIndex) else PodIndex.of(pods)


def _key(pod: PodView) -> str:
    return pod.key


def _layered(mapping: Mapping[K, V]) -> Layered[K, V]:
    return mapping if isinstance(mapping, Layered) else Layered(dict(mapping))


def _regrouped(groups: Mapping[K, tuple[PodView, ...]], touched: Iterable[K], arrived: Mapping[K, list[PodView]],
               left: Set[str]) -> dict[K, tuple[PodView, ...]]:
    """The changes that make each `touched` group of `groups` again: its pods whose key did not leave, and those that
    `arrived` in it, in key order; a group left empty is _GONE. The other groups stay the same tuples."""
    out: dict[K, tuple[PodView, ...]] = {}
    for group in touched:
        kept = [p for p in groups.get(group, ()) if p.key not in left]
        kept += arrived.get(group, ())
        out[group] = _by_key(kept) if kept else _GONE
    return out


@dataclass(frozen=True)
class PodIndex:
    """The pods by key, and the groupings the planner reads (module docstring)."""

    pods: Mapping[str, PodView] = field(default_factory=dict)  # "namespace/name" -> view
    # node name -> the pods holding resources there (bound and not finished: PodView.holds_resources), in key order;
    # a name no node has is kept too (a pod bound to a node that is gone)
    on_node: Mapping[str, tuple[PodView, ...]] = field(default_factory=dict)
    # pods not bound and not finished ("namespace/name" -> view): pending, gated or being deleted
    unbound: Mapping[str, PodView] = field(default_factory=dict)
    # job (PodView.job) -> its pods not finished, in key order
    by_job: Mapping[JobKey, tuple[PodView, ...]] = field(default_factory=dict)
    # uid -> the pod with that uid (the greatest key among pods sharing one: only a hand-made snapshot has them)
    by_uid: Mapping[str, PodView] = field(default_factory=dict)
    # uid -> the keys of the pods with it, for the rare uid more than one pod carries
    _uid_keys: Mapping[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, pods: Iterable[PodView]) -> PodIndex:
        """The index of `pods`, from scratch. A key given twice keeps its last view (as a cache would)."""
        by_key: dict[str, PodView] = {}
        for pod in pods:
            by_key[pod.key] = pod
        on_node: dict[str, list[PodView]] = {}
        by_job: dict[JobKey, list[PodView]] = {}
        unbound: dict[str, PodView] = {}
        by_uid: dict[str, PodView] = {}
        uid_keys: dict[str, set[str]] = {}
        for key in sorted(by_key):  # one sort, and every group fills in key order
            pod = by_key[key]
            uid = pod.uid
            if uid:
                held = by_uid.get(uid)
                if held is not None:
                    uid_keys.setdefault(uid, {held.key}).add(key)
                by_uid[uid] = pod
            if pod.phase in TERMINAL:
                continue
            job = by_job.get(pod.job)
            if job is None:
                by_job[pod.job] = [pod]
            else:
                job.append(pod)
            if pod.node_name:
                mine = on_node.get(pod.node_name)
                if mine is None:
                    on_node[pod.node_name] = [pod]
                else:
                    mine.append(pod)
            else:
                unbound[key] = pod
        return cls(pods=Layered(by_key), on_node={n: tuple(p) for n, p in on_node.items()}, unbound=unbound,
                   by_job=Layered({j: tuple(p) for j, p in by_job.items()}), by_uid=Layered(by_uid),
                   _uid_keys={uid: frozenset(keys) for uid, keys in uid_keys.items()})

    def updated(self, changed: Iterable[PodView] = (), removed: Iterable[str] = ()) -> PodIndex:
        """The index after `changed` (pods added, or new views of pods already here) and `removed` (keys of pods
        gone; a key not here is ignored). A key both changed and removed is changed (its last word). This index is
        left as it was."""
        changes = {pod.key: pod for pod in changed}
        before = self.pods
        gone = {key for key in removed if key not in changes and key in before}
        if not changes and not gone:
            return self
        unbound = dict(self.unbound)
        nodes: set[str] = set()  # groups touched: rebuilt below
        jobs: set[JobKey] = set()
        uids: set[str] = set()
        def touch(pod: PodView) -> None:  # the groups its view is in are made again
            if pod.phase not in TERMINAL:
                jobs.add(pod.job)
                if pod.node_name:
                    nodes.add(pod.node_name)
            if pod.uid:
                uids.add(pod.uid)

        for key in gone | changes.keys():
            old = before.get(key)
            if old is not None:
                touch(old)
            new = changes.get(key)
            if new is None:
                unbound.pop(key, None)
                continue
            touch(new)
            if new.phase not in TERMINAL and not new.node_name:
                unbound[key] = new
            else:
                unbound.pop(key, None)
        pods = _layered(before).with_changes({**dict.fromkeys(gone, _GONE), **changes})
        arrived_on: dict[str, list[PodView]] = {}
        arrived_in: dict[JobKey, list[PodView]] = {}
        arrived_uid: dict[str, set[str]] = {}
        for pod in changes.values():
            if pod.uid:
                arrived_uid.setdefault(pod.uid, set()).add(pod.key)
            if pod.phase not in TERMINAL:
                arrived_in.setdefault(pod.job, []).append(pod)
                if pod.node_name:
                    arrived_on.setdefault(pod.node_name, []).append(pod)
        left = changes.keys() | gone  # keys whose old view leaves its groups
        on_node = dict(self.on_node)
        for name, group in _regrouped(self.on_node, nodes, arrived_on, left).items():
            if group is _GONE:
                on_node.pop(name, None)
            else:
                on_node[name] = group
        by_job = _layered(self.by_job).with_changes(_regrouped(self.by_job, jobs, arrived_in, left))
        uid_keys = dict(self._uid_keys)
        uid_changes: dict[str, PodView] = {}
        for uid in uids:
            held = uid_keys.get(uid) or ({self.by_uid[uid].key} if uid in self.by_uid else set())
            keys = {k for k in held if k in pods and pods[k].uid == uid}
            keys |= arrived_uid.get(uid, set())
            uid_changes[uid] = pods[max(keys)] if keys else _GONE
            if len(keys) > 1:
                uid_keys[uid] = frozenset(keys)
            else:
                uid_keys.pop(uid, None)
        return PodIndex(pods=pods, on_node=on_node, unbound=unbound, by_job=by_job,
                        by_uid=_layered(self.by_uid).with_changes(uid_changes), _uid_keys=uid_keys)
