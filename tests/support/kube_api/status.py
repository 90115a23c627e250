"""The ``Status`` bodies a real API server answers errors with (metav1.Status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from support.kube_api.validation import Cause


class ApiError(Exception):
    """An error answer: HTTP code, Status reason and message, optional details and headers."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = dict(details) if details is not None else None
        self.headers = dict(headers or {})
        self.plain: str | None = None  # a plain-text answer instead of a Status body

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(code: int, reason: str, message: str,
                details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message, "reason": reason,
                            "code": code}
    if details is not None:
        body["details"] = dict(details)
    return body


def page_not_found() -> ApiError:
    # What a real server answers for an API group it does not serve at all: not even a Status.
    error = ApiError(404, "NotFound", "404 page not found")
    error.plain = "404 page not found\n"
    return error


def not_found_resource() -> ApiError:
    # What a real server says for a group/version/plural it does not serve (no CRD).
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def not_found(resource: str, group: str, plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found',
                    {"name": name, "group": group, "kind": plural})


def already_exists(resource: str, group: str, plural: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists',
                    {"name": name, "group": group, "kind": plural})


def conflict(resource: str, group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}',
                    {"name": name, "group": group, "kind": plural})


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    summary = ", ".join(f"{cause.field}: {cause.message}" for cause in causes)
    shown = f"[{summary}]" if len(causes) > 1 else summary
    return ApiError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {shown}',
                    {"name": name, "group": group, "kind": kind,
                     "causes": [cause.to_dict() for cause in causes]})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(user: str, verb: str, resource: str, group: str, plural: str, namespace: str,
              name: str | None) -> ApiError:
    subject = f'{resource} "{name}"' if name else resource
    details: dict[str, Any] = {"group": group, "kind": plural}
    if name:
        details["name"] = name
    return ApiError(403, "Forbidden",
                    f'{subject} is forbidden: User "{user}" cannot {verb} resource "{plural}" '
                    f'in API group "{group}" in the namespace "{namespace}"', details)


def expired(requested: int, oldest: int) -> dict[str, Any]:
    return status_body(410, "Expired", f"too old resource version: {requested} ({oldest})")


# The answers a fault can inject, as a real server words them.
FAULTS: dict[int, tuple[str, str]] = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: etcdserver: request timed out"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "Timeout: request did not complete within requested timeout - context deadline exceeded"),
}
