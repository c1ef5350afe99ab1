"""A pod's reservation affinity and the other pod-side rules of who may use a Reservation (seed 003, issue 18), as
Koordinator documents them (its apis/extension/reservation.go), for both Reservation sources (shared.views
ReservationView: Reservoir's own and Koordinator's).

The affinity annotation (`reservoir.sh/reservation-affinity`, else Koordinator's
`scheduling.koordinator.sh/reservation-affinity`) holds a plain Reservation name (Reservoir's short form) or
Koordinator's JSON object with any of:
- `name`: the Reservation of that name;
- `reservationSelector`: {label: value}, all of them on the Reservation;
- `requiredDuringSchedulingIgnoredDuringExecution.reservationSelectorTerms`: node selector terms read against the
  Reservation (matchExpressions over its labels, In/NotIn/Exists/DoesNotExist/Gt/Lt; matchFields over
  `metadata.name`), ORed, each term's requirements ANDed;
- `tolerations`: tolerate the Reservation's `spec.taints`.
The constraints it sets are ANDed and only narrow: the pod must still be an owner of the Reservation (`may_use`).
Tolerations alone narrow nothing. Any other key is ignored, and named (`ReservationAffinity.ignored`: the webhook's
admission Warning).

`may_use`: the Reservation's owners match the pod (shared.matching), the pod does not carry the label
`scheduling.koordinator.sh/reservation-ignored: "true"` (it ignores every Reservation: no handover gate, no lock
toleration, no required affinity; scheduled as if none existed), and the affinity's tolerations tolerate each of the
Reservation's taints whose effect is NoSchedule or NoExecute (PreferNoSchedule only prefers; an unreadable affinity
tolerates nothing).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import keys
from shared.matching import expression_holds, reservation_matches
from shared.tolerations import tolerates_taint
from shared.views import ReservationView

MAX_AFFINITY_LENGTH = 4096  # a name is at most 253 characters; a selector of a few labels fits many times over
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
KNOWN_KEYS = frozenset(("name", "reservationSelector", REQUIRED, "tolerations"))
HARD_EFFECTS = ("NoSchedule", "NoExecute")
FORMS = ('a Reservation name, {"name": "<reservation>"}, {"reservationSelector": {"<label>": "<value>"}}, '
         f'{{"{REQUIRED}": {{"reservationSelectorTerms": [...]}}}} and/or {{"tolerations": [...]}}')


def _shown(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class ReservationAffinity:
    """One pod's reservation affinity, read (module docstring)."""

    name: str = ""
    selector: Mapping[str, str] | None = None  # reservationSelector
    terms: tuple[Mapping[str, Any], ...] | None = None  # reservationSelectorTerms (None: not set)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    ignored: tuple[str, ...] = field(default=())  # keys of the JSON Reservoir does not read

    @property
    def restricts(self) -> bool:
        """It names or selects Reservations (tolerations alone narrow nothing)."""
        return bool(self.name) or self.selector is not None or self.terms is not None

    def selects(self, reservation: ReservationView) -> bool:
        """The Reservation meets every constraint set (name, selector, terms)."""
        if self.name and reservation.name != self.name:
            return False
        if self.selector is not None and any(reservation.labels.get(k) != v for k, v in self.selector.items()):
            return False
        if self.terms is not None and not any(_term_selects(t, reservation) for t in self.terms):
            return False
        return True


def _term_selects(term: Mapping[str, Any], reservation: ReservationView) -> bool:
    """One reservationSelectorTerm (kube's NodeSelectorTerm read against a Reservation): every requirement holds; a
    term with none matches nothing, as in kube."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    name = {"metadata.name": reservation.name}
    return (all(expression_holds(e, reservation.labels, numeric=True) for e in expressions)
            and all(expression_holds(f, name) for f in fields))


def _terms(value: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    """`reservationSelectorTerms` checked for shape (ValueError naming the field and what is expected)."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} must be a non-empty list of selector terms such as "
                         '[{"matchExpressions": [{"key": "<label>", "operator": "In", "values": ["<value>"]}]}]')
    for i, term in enumerate(value):
        if not isinstance(term, Mapping):
            raise ValueError(f"{where}[{i}] must be an object with matchExpressions and/or matchFields")
        for part in ("matchExpressions", "matchFields"):
            requirements = term.get(part)
            if requirements is None:
                continue
            if not isinstance(requirements, list) or not all(
                    isinstance(r, Mapping) and isinstance(r.get("key"), str) and isinstance(r.get("operator"), str)
                    and (r.get("values") is None or (isinstance(r.get("values"), list)
                                                     and all(isinstance(v, str) for v in r["values"])))
                    for r in requirements):
                raise ValueError(f"{where}[{i}].{part} must be a list of {{key, operator, values: [strings]}}")
            if part == "matchFields" and any(r["key"] != "metadata.name" for r in requirements):
                raise ValueError(f"{where}[{i}].matchFields: only the key metadata.name is supported")
    return tuple(value)


def _tolerations(value: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list) or not all(
            isinstance(t, Mapping) and all(t.get(k) is None or isinstance(t.get(k), str)
                                           for k in ("key", "operator", "value", "effect")) for t in value):
        raise ValueError(f"{where} must be a list of tolerations such as "
                         '[{"key": "<taint>", "operator": "Exists", "effect": "NoSchedule"}]')
    return tuple(value)


def _check_name(name: str, text: str) -> str:
    """A Reservation name (plain or JSON `name`): a DNS subdomain, so never a Koordinator key
    (`scheduling.koordinator.sh/<name>`) nor anything that could pass for one."""
    if not keys.is_dns_subdomain(name):
        raise ValueError(f"reservation affinity {_shown(text)}: the Reservation name {_shown(name)} is not one a "
                         f"Reservation can have: a DNS subdomain (lowercase letters, digits, '-' and '.', at most "
                         f"{keys.MAX_DNS_SUBDOMAIN} characters), without the API group")
    return name


def parse_reservation_affinity(text: Any) -> ReservationAffinity:
    """The affinity annotation's text read (module docstring); ValueError names what is wrong and what is accepted.
    Read once per text (`_parse`, cached): the planner asks for every owner pod on every plan."""
    if not isinstance(text, str):
        raise ValueError(f"reservation affinity must be a string, not {type(text).__name__}")
    return _parse(text)


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> ReservationAffinity:
    stripped = text.strip()
    if len(stripped) > MAX_AFFINITY_LENGTH:
        raise ValueError(f"reservation affinity is {len(stripped)} characters long: at most {MAX_AFFINITY_LENGTH}; "
                         f"give {FORMS}")
    if not stripped.startswith("{"):
        if not stripped:
            raise ValueError("empty reservation affinity")
        return ReservationAffinity(name=_check_name(stripped, text))
    try:
        data = json.loads(stripped)
    except (ValueError, RecursionError):  # not JSON, or nested past what the parser follows
        data = None
    if not isinstance(data, dict):
        raise ValueError(f"reservation affinity {_shown(text)} is not valid JSON: expected {FORMS}")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"reservation affinity {_shown(text)}: name must be a non-empty string")
    if name is not None:
        _check_name(name, text)
    selector = data.get("reservationSelector")
    if selector == {}:
        raise ValueError(f"reservation affinity {_shown(text)} has an empty reservationSelector, which would select "
                         "every Reservation: name one, or give at least one label")
    if selector is not None and not (isinstance(selector, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items())):
        raise ValueError(f"reservation affinity {_shown(text)}: reservationSelector must be "
                         '{"<label>": "<value>", ...}')
    terms: tuple[Mapping[str, Any], ...] | None = None
    required = data.get(REQUIRED)
    if required is not None:
        if not isinstance(required, dict) or "reservationSelectorTerms" not in required:
            raise ValueError(f"reservation affinity {_shown(text)}: {REQUIRED} must be "
                             '{"reservationSelectorTerms": [...]}')
        terms = _terms(required["reservationSelectorTerms"], f"{REQUIRED}.reservationSelectorTerms")
    tolerations = _tolerations(data["tolerations"], "tolerations") if data.get("tolerations") is not None else ()
    ignored = tuple(sorted(str(k) for k in data if k not in KNOWN_KEYS))
    if isinstance(required, dict):
        ignored += tuple(f"{REQUIRED}.{k}" for k in sorted(required) if k != "reservationSelectorTerms")
    affinity = ReservationAffinity(name=name or "", selector=selector, terms=terms, tolerations=tolerations,
                                   ignored=ignored)
    if not affinity.restricts and not tolerations:
        raise ValueError(f"reservation affinity {_shown(text)} is not valid: expected {FORMS}")
    return affinity


def affinity_text(annotations: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(key, text) of the pod's reservation affinity annotation: Reservoir's key first, else Koordinator's."""
    for key in (keys.RESERVATION_AFFINITY, keys.KOORDINATOR_RESERVATION_AFFINITY):
        if annotations.get(key):
            return key, annotations[key]
    return None


def pod_affinity(annotations: Mapping[str, Any]) -> ReservationAffinity | None:
    """The pod's affinity; None when it has none or it is unreadable (the validating webhook refuses those)."""
    found = affinity_text(annotations)
    if found is None:
        return None
    try:
        return parse_reservation_affinity(found[1])
    except ValueError:
        return None


def ignores_reservations(labels: Mapping[str, Any]) -> bool:
    """Koordinator's `reservation-ignored` label: "true" and the pod ignores every Reservation."""
    return labels.get(keys.KOORDINATOR_RESERVATION_IGNORED) == "true"


def tolerates_reservation(reservation: ReservationView, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Each of the Reservation's NoSchedule / NoExecute taints is tolerated (kube's ToleratesTaint)."""
    return all(any(tolerates_taint(t, taint.key, taint.value, taint.effect) for t in tolerations)
               for taint in reservation.taints if taint.effect in HARD_EFFECTS)


def may_use(reservation: ReservationView, pod: Mapping[str, Any], namespace: str) -> bool:
    """The pod (API JSON; its metadata is read) may use the Reservation (module docstring)."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return False
    labels = meta.get("labels")
    if isinstance(labels, Mapping) and ignores_reservations(labels):
        return False
    if not reservation_matches(reservation.owners, pod, namespace):
        return False
    if reservation.taints:
        annotations = meta.get("annotations")
        affinity = pod_affinity(annotations) if isinstance(annotations, Mapping) else None
        return tolerates_reservation(reservation, affinity.tolerations if affinity is not None else ())
    return True
