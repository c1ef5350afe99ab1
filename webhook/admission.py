"""AdmissionReview `admission.k8s.io/v1` in and out. A malformed body is a `BadReview` (HTTP 400)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

API_VERSION = "admission.k8s.io/v1"


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer; the message says what is wrong."""


@dataclass(frozen=True)
class Request:
    uid: str
    operation: str
    kind: str
    namespace: str
    name: str
    obj: Mapping[str, Any]


def parse_review(body: bytes) -> Request:
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadReview(f"request body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise BadReview("request body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
                        f"{review.get('apiVersion')!r} {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request object")
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


def response(uid: str, *, allowed: bool = True, message: str = "", patch: list[dict[str, Any]] | None = None,
             warnings: list[str] | None = None, code: int = 403) -> dict[str, Any]:
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"code": code, "reason": "Forbidden" if code == 403 else "Invalid", "message": message}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        answer["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}
