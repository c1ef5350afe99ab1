"""AdmissionReview `admission.k8s.io/v1` in and out. A malformed body is a `BadReview` (HTTP 400).

The review bodies are typed as the API defines them (`AdmissionReview`, `AdmissionRequest`, `AdmissionResponse`
in k8s.io/api/admission/v1), as kopf's `structs/reviews.py` does: only the fields this webhook reads or writes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

from shared.jsonpatch import Op

API_VERSION: Final = "admission.k8s.io/v1"


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


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    kind: str
    namespace: str
    name: str
    obj: Mapping[str, Any]


def _review(body: bytes) -> ReviewRequest:
    """The body as an AdmissionReview of the right apiVersion and kind with a request object; the fields inside
    the request are checked by the caller."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadReview(f"request body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise BadReview("request body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
                        f"{review.get('apiVersion')!r} {review.get('kind')!r}")
    if not isinstance(review.get("request"), dict):
        raise BadReview("AdmissionReview has no request object")
    return cast(ReviewRequest, review)


def parse_review(body: bytes) -> Request:
    # The payload's fields come from the wire: each is checked at run time although the type names it.
    request = _review(body)["request"]
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("AdmissionReview request.uid is missing")
    obj = request.get("object")
    if obj is None and request.get("operation") == "DELETE":
        obj = request.get("oldObject") or {}
    if not isinstance(obj, dict):
        raise BadReview("AdmissionReview request.object must be an object")
    kind = request.get("kind") or {}
    return Request(
        uid=uid,
        operation=str(request.get("operation") or ""),
        kind=str(kind.get("kind") or "") if isinstance(kind, dict) else "",
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        obj=obj,
    )


def response(uid: str, *, allowed: bool = True, message: str = "", patch: list[Op] | None = None,
             warnings: list[str] | None = None, code: int = 403) -> ReviewResponse:
    answer: ResponsePayload = {"uid": uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"code": code, "reason": "Forbidden" if code == 403 else "Invalid", "message": message}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        answer["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}
