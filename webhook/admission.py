"""AdmissionReview `admission.k8s.io/v1` in and out. A malformed body is a `BadReview` (HTTP 400).

The review bodies are typed as the API defines them (`AdmissionReview`, `AdmissionRequest`, `AdmissionResponse`
in k8s.io/api/admission/v1), as kopf's `structs/reviews.py` does: only the fields this webhook reads or writes.

The object under review is checked against a `Shape` before any route sees it: the JSON types of the fields the
route code reads as it finds them (metadata, a pod's spec, a PodGroup's queue, a ConfigMap's data), which are the
types the API server itself enforces (core types decoded into Go structs, CRD fields with a declared type). A
request where they are wrong did not come from an API server: it is answered 400 naming the field, and the route
functions never meet a list where they expect an object. Fields a validator checks and explains itself (a Queue's
guarantee, a Reservation's owners, quantities in a CRD) are left to the validator, which denies with a message.
"""

from __future__ import annotations

import base64
import json
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

from shared.duration import DurationError
from shared.jsonpatch import Op
from shared.quantity import QuantityError, parse_quantity

API_VERSION: Final = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
MESSAGE_LIMIT = 2048  # characters of a denial message or of a 400 reason; the rest is cut, saying so
WARNING_LIMIT = 512  # characters of one warning
MAX_WARNINGS = 10


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer; the message says what is wrong."""


class RequestKind(TypedDict, total=False):
    """`request.kind`: the GroupVersionKind of the object under review."""

    group: str
    version: str
    kind: str


class RequestPayload(TypedDict, total=False):
    """`request` (AdmissionRequest): what the apiserver asks about. `object` is absent on DELETE, where
    `oldObject` holds the object being deleted."""

    uid: str
    kind: RequestKind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str
    name: str
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool
    userInfo: dict[str, Any]  # username, groups: who sent the request


class ReviewRequest(TypedDict):
    """An AdmissionReview as the apiserver sends it."""

    apiVersion: str
    kind: str
    request: RequestPayload


class ResponseStatus(TypedDict):
    """`response.status` (a metav1.Status) of a denial."""

    code: int
    reason: Literal["Forbidden", "Invalid"]
    message: str


class ResponsePayload(TypedDict):
    """`response` (AdmissionResponse): the answer, with a base64 JSON Patch when the object is changed."""

    uid: str
    allowed: bool
    status: NotRequired[ResponseStatus]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]


class ReviewResponse(TypedDict):
    """An AdmissionReview as the webhook answers it."""

    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    response: ResponsePayload


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """One line of at most `limit` characters: newlines folded, the rest cut with a note of how much."""
    line = " ".join(text.split("\n")) if "\n" in text else text
    if len(line) <= limit:
        return line
    return f"{line[:limit]}... ({len(line) - limit} more characters)"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlong = 40


def shown(value: Any) -> str:
    """A value as a message quotes it: repr() for everything short, shortened (and never recursing deep) for a long
    string, a big structure or a huge number, so a hostile value can neither flood a message nor overflow the stack."""
    return _REPR.repr(value)


def json_type(value: Any) -> str:
    """The JSON name of a value's type, as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


# --- shapes: the JSON types of the fields a route reads ---

class Shape:
    """The JSON type of one field (and, for objects and lists, of what they hold). JSON decodes to exact types
    (dict, list, str, int, float, bool, None), so types are compared exactly: a bool is not an integer here."""

    def fits(self, value: Any) -> bool:
        """True when `value` is of this shape: the fast walk every request takes (no path is built)."""
        raise NotImplementedError

    def problem(self, value: Any, path: str, deep: bool = False) -> str | None:
        """The first place where `value` (at `path`) is not of this shape, as a one-line reason; None when it is.
        `deep` also parses what has a grammar (quantities): to find the field behind a parser's error."""
        raise NotImplementedError

    def check(self, value: Any, path: str) -> str | None:
        """`problem`, after the fast walk found one (most requests have none)."""
        return None if self.fits(value) else self.problem(value, path)


class Leaf(Shape):
    def __init__(self, expected: str, *types: type, max_length: int | None = None) -> None:
        self.expected, self.types, self.max_length = expected, frozenset(types), max_length

    def fits(self, value: Any) -> bool:
        return type(value) in self.types and (self.max_length is None or len(value) <= self.max_length)

    def problem(self, value: Any, path: str, deep: bool = False) -> str | None:
        if type(value) not in self.types:
            return f"{path} must be {self.expected}, not {json_type(value)}"
        if self.max_length is not None and len(value) > self.max_length:
            return f"{path} is {len(value)} characters long: at most {self.max_length}"
        return None


class Quantity(Shape):
    """A Kubernetes quantity: a string or an integer; with `deep`, one the parser reads."""

    def fits(self, value: Any) -> bool:
        return type(value) is str or type(value) is int

    def problem(self, value: Any, path: str, deep: bool = False) -> str | None:
        if not self.fits(value):
            return f"{path} must be a quantity (a string such as 500m or 2Gi), not {json_type(value)}"
        if deep:
            try:
                parse_quantity(value)
            except (QuantityError, OverflowError) as err:
                return f"{path}: {err}"
        return None


class Object(Shape):
    """A JSON object; the fields named are checked when present and not null, others are not read."""

    def __init__(self, fields: Mapping[str, Shape] | None = None) -> None:
        self.fields = tuple((fields or {}).items())

    def fits(self, value: Any) -> bool:
        if type(value) is not dict:
            return False
        for name, shape in self.fields:
            item = value.get(name)
            if item is not None and not shape.fits(item):
                return False
        return True

    def problem(self, value: Any, path: str, deep: bool = False) -> str | None:
        if type(value) is not dict:
            return f"{path} must be an object, not {json_type(value)}"
        for name, shape in self.fields:
            item = value.get(name)
            if item is not None:
                found = shape.problem(item, f"{path}.{name}", deep)
                if found:
                    return found
        return None


class ListOf(Shape):
    def __init__(self, item: Shape) -> None:
        self.item = item

    def fits(self, value: Any) -> bool:
        if type(value) is not list:
            return False
        fits = self.item.fits
        for item in value:
            if not fits(item):
                return False
        return True

    def problem(self, value: Any, path: str, deep: bool = False) -> str | None:
        if type(value) is not list:
            return f"{path} must be a list, not {json_type(value)}"
        for index, item in enumerate(value):
            found = self.item.problem(item, f"{path}[{index}]", deep)
            if found:
                return found
        return None


class MapOf(Shape):
    """A JSON object used as a map (labels, annotations, a ResourceList): every value of the shape given."""

    def __init__(self, value: Shape) -> None:
        self.value = value
        # a map of plain strings (labels, annotations) is checked by type alone
        self.only = next(iter(value.types)) if isinstance(value, Leaf) and len(value.types) == 1 \
            and value.max_length is None else None

    def fits(self, value: Any) -> bool:
        if type(value) is not dict:
            return False
        only = self.only
        if only is not None:
            for item in value.values():
                if type(item) is not only:
                    return False
            return True
        fits = self.value.fits
        for item in value.values():
            if not fits(item):
                return False
        return True

    def problem(self, value: Any, path: str, deep: bool = False) -> str | None:
        if type(value) is not dict:
            return f"{path} must be an object, not {json_type(value)}"
        for key, item in value.items():
            found = self.value.problem(item, f"{path}[{json.dumps(key) if len(key) <= 80 else shown(key)}]", deep)
            if found:
                return found
        return None


STRING = Leaf("a string", str)
NAME = Leaf("a string", str, max_length=253)  # object names, namespaces: DNS subdomains at most
BOOLEAN = Leaf("a boolean", bool)
INTEGER = Leaf("an integer", int)
QUANTITY = Quantity()
ANY_OBJECT = Object()

METADATA = Object({
    "name": NAME, "generateName": NAME, "namespace": NAME, "uid": NAME, "resourceVersion": STRING,
    "labels": MapOf(STRING), "annotations": MapOf(STRING), "finalizers": ListOf(STRING),
    "creationTimestamp": STRING, "deletionTimestamp": STRING,
    "ownerReferences": ListOf(Object({"apiVersion": STRING, "kind": STRING, "name": STRING, "uid": STRING,
                                      "controller": BOOLEAN, "blockOwnerDeletion": BOOLEAN})),
})
RESOURCE_LIST = MapOf(QUANTITY)
RESOURCES = Object({"requests": RESOURCE_LIST, "limits": RESOURCE_LIST})
CONTAINER = Object({"name": STRING, "restartPolicy": STRING, "resources": RESOURCES})
REQUIREMENT = Object({"key": STRING, "operator": STRING, "values": ListOf(STRING)})
NODE_SELECTOR_TERM = Object({"matchExpressions": ListOf(REQUIREMENT), "matchFields": ListOf(REQUIREMENT)})
AFFINITY = Object({"nodeAffinity": Object({
    "requiredDuringSchedulingIgnoredDuringExecution": Object({"nodeSelectorTerms": ListOf(NODE_SELECTOR_TERM)}),
    "preferredDuringSchedulingIgnoredDuringExecution": ListOf(Object({"weight": INTEGER,
                                                                      "preference": NODE_SELECTOR_TERM})),
})})
TOLERATION = Object({"key": STRING, "operator": STRING, "value": STRING, "effect": STRING,
                     "tolerationSeconds": INTEGER})
POD_SPEC = Object({
    "nodeName": STRING, "priorityClassName": STRING, "priority": INTEGER, "preemptionPolicy": STRING,
    "schedulerName": STRING, "nodeSelector": MapOf(STRING), "tolerations": ListOf(TOLERATION),
    "containers": ListOf(CONTAINER), "initContainers": ListOf(CONTAINER), "resources": RESOURCES,
    "overhead": RESOURCE_LIST, "affinity": AFFINITY,
})
POD = Object({"metadata": METADATA, "spec": POD_SPEC})
PODGROUP = Object({"metadata": METADATA, "spec": Object({"queue": STRING, "priorityClassName": STRING,
                                                         "minMember": INTEGER})})
QUEUE = Object({"metadata": METADATA, "spec": ANY_OBJECT})  # guarantee, capability, deserved: the validator's
RESERVATION = Object({"metadata": METADATA, "spec": ANY_OBJECT})  # owners, ttl, template...: the validator's
CONFIGMAP = Object({"metadata": METADATA, "data": MapOf(STRING)})
REVIEW_KIND = Object({"group": STRING, "version": STRING, "kind": STRING})


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    kind: str
    namespace: str
    name: str
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None = None  # `oldObject` on UPDATE (and DELETE): what the update changes is judged
    username: str = ""  # `userInfo.username`: who sent it (a node's own identity is `system:node:<name>`)
    groups: tuple[str, ...] = ()  # `userInfo.groups` (a node's: `system:nodes`)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _review(body: bytes) -> ReviewRequest:
    """The body as an AdmissionReview of the right apiVersion and kind with a request object; the fields inside
    the request are checked by the caller."""
    try:
        review = json.loads(body, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as err:  # not JSON, not UTF-8, an integer of more than 4300 digits
        raise BadReview(f"request body is not JSON: {err}") from None
    except RecursionError:
        raise BadReview("request body is not JSON this webhook reads: it nests deeper than about 1000 levels") from None
    if not isinstance(review, dict):
        raise BadReview("request body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
                        f"{shown(review.get('apiVersion'))} {shown(review.get('kind'))}")
    if not isinstance(review.get("request"), dict):
        raise BadReview("AdmissionReview has no request object")
    return cast(ReviewRequest, review)


def _checked(shape: Shape, value: Any, path: str) -> None:
    found = shape.check(value, path)
    if found:
        raise BadReview(found)


def parse_review(body: bytes, shape: Shape | None = None) -> Request:
    """The AdmissionReview in `body`, every field this webhook reads checked; with `shape`, the object (and the
    old object) checked against it (module docstring). BadReview says what is wrong, in one line."""
    # The payload's fields come from the wire: each is checked at run time although the type names it.
    request: Mapping[str, Any] = _review(body)["request"]
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("AdmissionReview request.uid is missing")
    _checked(NAME, uid, "request.uid")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise BadReview(f"request.operation is {shown(operation)}: expected one of {', '.join(OPERATIONS)}")
    for name, field_shape in (("kind", REVIEW_KIND), ("namespace", NAME), ("name", NAME), ("dryRun", BOOLEAN),
                              ("object", ANY_OBJECT), ("oldObject", ANY_OBJECT)):
        if request.get(name) is not None:
            _checked(field_shape, request[name], f"request.{name}")
    obj, old = request.get("object"), request.get("oldObject")
    if obj is None and operation in ("DELETE", "CONNECT"):
        obj = old or {}
    if not isinstance(obj, dict):
        raise BadReview("AdmissionReview request.object must be an object")
    if shape is not None and operation in ("CREATE", "UPDATE"):
        _checked(shape, obj, "request.object")
        if old is not None:
            _checked(shape, old, "request.oldObject")
    kind = request.get("kind") or {}
    user = request.get("userInfo")
    username = user.get("username") if isinstance(user, dict) else None
    groups = user.get("groups") if isinstance(user, dict) else None
    return Request(
        uid=uid,
        operation=operation,
        kind=kind.get("kind") or "",
        namespace=request.get("namespace") or "",
        name=request.get("name") or "",
        obj=obj,
        old=old,
        username=username if isinstance(username, str) else "",
        groups=tuple(g for g in groups[:64] if isinstance(g, str)) if isinstance(groups, list) else (),
    )


def locate(shape: Shape | None, request: Request, err: Exception) -> str:
    """The one-line reason for a parser's error (`QuantityError`, `DurationError`) met while answering `request`:
    the field it came from when the shape finds it, else the error as it is."""
    if shape is not None and isinstance(err, (QuantityError, DurationError)):
        for value, path in ((request.obj, "request.object"), (request.old, "request.oldObject")):
            found = shape.problem(value, path, deep=True) if value is not None else None
            if found:
                return found
    return f"request.object: {err}"


def response(uid: str, *, allowed: bool = True, message: str = "", patch: list[Op] | None = None,
             warnings: list[str] | None = None, code: int = 403) -> ReviewResponse:
    answer: ResponsePayload = {"uid": uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"code": code, "reason": "Forbidden" if code == 403 else "Invalid", "message": clip(message)}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        answer["warnings"] = [clip(w, WARNING_LIMIT) for w in warnings[:MAX_WARNINGS]]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}
