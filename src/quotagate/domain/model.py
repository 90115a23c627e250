"""Requests, their states and the validation of everything a caller sends."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quotagate.errors import InvalidInput

MAX_PAYLOAD_BYTES = 64 * 1024
MAX_AMOUNT = 10**12
MAX_WEIGHT = 1000
RECLAIM_POLICIES = ("never", "lower-priority", "any")
WITHIN_TENANT_POLICIES = ("never", "lower-priority")

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# Tenant and pool names become parts of Kubernetes object names and Redis keys,
# so they follow DNS-1123 labels.
_NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_RESOURCE_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

Cost = dict[str, int]


class RequestState(enum.StrEnum):
    WAITING = "waiting"
    RESERVED = "reserved"
    DELIVERED = "delivered"
    # Cancelled while reserved or delivered: still charged until the target
    # confirms the work stopped (docs/decisions/211).
    CANCELLING = "cancelling"
    # Chosen as a preemption victim while reserved or delivered: still charged
    # until the target confirms the stop, then ``preempted`` (docs/fair-sharing.md).
    PREEMPTING = "preempting"
    PREEMPTED = "preempted"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    REJECTED = "rejected"


CHARGED_STATES = frozenset(
    {RequestState.RESERVED, RequestState.DELIVERED, RequestState.CANCELLING,
     RequestState.PREEMPTING}
)
# Charged, stopping: only the target's confirmed stop ends them.
STOPPING_STATES = frozenset({RequestState.CANCELLING, RequestState.PREEMPTING})
FINAL_STATES = frozenset(
    {
        RequestState.COMPLETED,
        RequestState.FAILED,
        RequestState.CANCELLED,
        RequestState.EXPIRED,
        RequestState.REJECTED,
        RequestState.PREEMPTED,
    }
)


@dataclass(frozen=True)
class Request:
    id: str
    tenant: str
    state: RequestState
    cost: Cost
    priority: int
    payload: Any
    created: float
    pool: str | None = None
    target: str | None = None
    reason: str | None = None
    updated: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "state": self.state.value,
            "cost": dict(self.cost),
            "priority": self.priority,
            "payload": self.payload,
            "pool": self.pool,
            "target": self.target,
            "created": self.created,
            "updated": self.updated,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Submission:
    """A validated submit call, ready to be compared with what the ledger holds."""

    id: str
    tenant: str
    cost: Cost
    priority: int
    payload_json: str
    target: str | None = None
    payload: Any = field(default=None, compare=False)


def validate_request_id(value: object) -> str:
    if not isinstance(value, str) or not _ID_PATTERN.match(value):
        raise InvalidInput(
            "request id must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit",
            code="invalid_request_id",
        )
    return value


def validate_name(value: object, kind: str) -> str:
    if not isinstance(value, str) or not _NAME_PATTERN.match(value):
        raise InvalidInput(
            f"{kind} name must be a DNS-1123 label: 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit",
            code=f"invalid_{kind}_name",
        )
    return value


def validate_resource(value: object) -> str:
    if not isinstance(value, str) or not _RESOURCE_PATTERN.match(value):
        raise InvalidInput(
            "resource name must be 1-32 characters of lowercase letters, digits or '_', "
            "starting with a letter",
            code="invalid_resource",
        )
    return value


def validate_amounts(
    amounts: Mapping[str, object], *, what: str, allow_zero: bool
) -> dict[str, int]:
    """Check a resource→amount mapping: names valid, amounts whole and in range."""
    if not isinstance(amounts, Mapping) or not amounts:
        raise InvalidInput(f"{what} must name at least one resource", code=f"invalid_{what}")
    checked: dict[str, int] = {}
    for resource, amount in amounts.items():
        validate_resource(resource)
        # bool is an int subclass; "gpu=true" is a mistake, not a 1.
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidInput(
                f"{what} for {resource!r} must be a whole number, got {amount!r}",
                code=f"invalid_{what}",
            )
        low = 0 if allow_zero else 1
        if amount < low or amount > MAX_AMOUNT:
            bound = "zero or more" if allow_zero else "at least 1"
            raise InvalidInput(
                f"{what} for {resource!r} must be {bound} and at most {MAX_AMOUNT}, got {amount}",
                code=f"invalid_{what}",
            )
        checked[resource] = amount
    return dict(sorted(checked.items()))


def validate_limits(
    limits: Mapping[str, object], *, what: str
) -> dict[str, int | None]:
    """A resource→limit mapping where None (or "none") removes a limit."""
    if not isinstance(limits, Mapping):
        raise InvalidInput(f"{what} must map resources to amounts", code=f"invalid_{what}")
    removed = {resource for resource, amount in limits.items()
               if amount is None or amount == "none"}
    for resource in removed:
        validate_resource(resource)
    kept = {resource: amount for resource, amount in limits.items() if resource not in removed}
    checked: dict[str, int | None] = dict(
        validate_amounts(kept, what=what, allow_zero=True) if kept else {})
    checked.update(dict.fromkeys(removed))
    return dict(sorted(checked.items()))


def validate_weight(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WEIGHT:
        raise InvalidInput(f"weight must be a whole number between 1 and {MAX_WEIGHT}",
                           code="invalid_weight")
    return value


def validate_policy(value: object, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput(f"{what} must be one of {', '.join(allowed)}, got {value!r}",
                           code=f"invalid_{what}")
    return value


def validate_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1_000_000 <= value <= 1_000_000:
        raise InvalidInput(
            "priority must be a whole number between -1000000 and 1000000",
            code="invalid_priority",
        )
    return value


def canonical_payload(payload: Any) -> str:
    """Serialise a payload so equal payloads compare equal byte for byte."""
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload must be JSON: {exc}", code="invalid_payload") from exc
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidInput(
            f"payload is larger than {MAX_PAYLOAD_BYTES} bytes", code="payload_too_large"
        )
    return text


def parse_payload_text(text: str) -> Any:
    """Parse a payload given as JSON text (CLI, files)."""
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidInput(
            f"payload is larger than {MAX_PAYLOAD_BYTES} bytes", code="payload_too_large"
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"payload is not valid JSON: {exc}", code="invalid_payload") from exc


def build_submission(
    *,
    request_id: object,
    tenant: object,
    cost: Mapping[str, object],
    priority: object = 0,
    payload: Any = None,
    target: str | None = None,
) -> Submission:
    if target is not None:
        validate_name(target, "target")
    return Submission(
        id=validate_request_id(request_id),
        tenant=validate_name(tenant, "tenant"),
        cost=validate_amounts(cost, what="cost", allow_zero=False),
        priority=validate_priority(priority),
        payload_json=canonical_payload(payload),
        target=target,
        payload=payload,
    )
