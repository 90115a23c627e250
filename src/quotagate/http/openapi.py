"""What the OpenAPI document says beyond what FastAPI derives: errors and constraints.

The domain validators judge values and answer 400 with their own codes, so the
request models do not enforce these constraints themselves (pydantic would answer
422 first); the document states them all the same, so that a generated client
sends only what the API accepts and a conformance test can hold the API to it.
Every error is ``{code, message}`` (plus fields such as ``retry_after``), from
the one handler in :mod:`quotagate.http.errors`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quotagate.domain.model import NAME_PATTERN, REQUEST_ID_PATTERN
from quotagate.streams.keys import PART_PATTERN


class ErrorBody(BaseModel):
    """Every error the API answers."""

    model_config = ConfigDict(extra="allow")
    code: str = Field(description="Machine-readable, stable: what to branch on",
                      examples=["invalid_cost"])
    message: str = Field(description="One sentence for a person", examples=["cost for 'gpu' "
                                                                            "must be at least 1"])


_ERRORS = {
    400: "Invalid input (the code says which): nothing was changed",
    401: "No token, or an unknown or revoked one",
    403: "The token may not do this",
    404: "No such tenant, pool, request or topic (or not this token's to see)",
    409: "Conflicts with what the ledger holds (a changed replay, an id taken, a wrong state, "
         "a stale fencing token)",
    413: "The body, or a batch, is larger than the API accepts",
    422: "The body or a parameter does not have the documented shape",
    429: "A rate quota is exhausted; Retry-After says when to try again",
    503: "The ledger database or the rate store cannot take the request now; retry",
}

# Statuses every authenticated operation may answer.
API_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in _ERRORS.items()
}
# The probes answer without a token; only readiness can fail.
PROBE_ERRORS: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "The ledger database does not answer"},
}


def _anchored(pattern: str) -> str:
    # JSON Schema patterns search; anchor them to mean what fullmatch means.
    return f"^{pattern}$"


# Path and query parameters by name: the same constraint wherever the name appears.
PARAMETER_SCHEMAS: dict[str, dict[str, Any]] = {
    "tenant": {"type": "string", "pattern": _anchored(NAME_PATTERN), "maxLength": 63},
    "pool": {"type": "string", "pattern": _anchored(NAME_PATTERN), "maxLength": 63},
    "cohort": {"type": "string", "pattern": _anchored(NAME_PATTERN), "maxLength": 63},
    "request_id": {"type": "string", "pattern": _anchored(REQUEST_ID_PATTERN),
                   "maxLength": 128},
    # /v1/audit?request=ID
    "request": {"type": "string", "pattern": _anchored(REQUEST_ID_PATTERN), "maxLength": 128},
    "topic": {"type": "string", "pattern": _anchored(PART_PATTERN), "maxLength": 100},
    # Opaque: base64url of the last row's sort key (quotagate.store.listing).
    "cursor": {"type": "string", "pattern": "^[A-Za-z0-9_=-]+$", "maxLength": 512},
}


def whole_bounds(node: Any) -> Any:
    """Integer bounds as integers again.

    FastAPI's OpenAPI model types ``minimum``/``maximum`` as floats, so ``1`` comes out
    as ``1.0``; a generator reading that bound may then send ``25828.0`` for an
    integer, which the API's strict types refuse.
    """
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("minimum", "maximum") and isinstance(value, float) and value.is_integer() \
                    and node.get("type") == "integer":
                node[key] = int(value)
            else:
                whole_bounds(value)
    elif isinstance(node, list):
        for item in node:
            whole_bounds(item)
    return node


def constrain_parameters(document: dict[str, Any]) -> dict[str, Any]:
    """Put :data:`PARAMETER_SCHEMAS` on every parameter of that name (nullable ones stay so)."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                constraint = PARAMETER_SCHEMAS.get(parameter.get("name"))
                if constraint is None:
                    continue
                schema = parameter.get("schema", {})
                if "anyOf" in schema:  # Optional[str]: constrain the string branch
                    schema["anyOf"] = [
                        {**constraint} if branch.get("type") == "string" else branch
                        for branch in schema["anyOf"]
                    ]
                else:
                    parameter["schema"] = {**schema, **constraint}
    return document
