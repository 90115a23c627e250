"""Requests, their states and the validation of everything a caller sends."""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quotagate.domain.budget import parse_duration
from quotagate.errors import InvalidInput, quoted

MAX_PAYLOAD_BYTES = 64 * 1024
# Arrays and objects inside one another, at most: every later json.dumps of the
# payload (the answer, the delivery, the dashboard) recurses once per level, and
# must stay far from Python's recursion limit wherever it runs (docs/decisions/808).
MAX_PAYLOAD_DEPTH = 64
MAX_AMOUNT = 10**12
MAX_WEIGHT = 1000
RECLAIM_POLICIES = ("never", "lower-priority", "any")
WITHIN_TENANT_POLICIES = ("never", "lower-priority")
# What a confirmed preemption does to its victim (docs/decisions/720).
ON_PREEMPT_POLICIES = ("fail", "requeue")

# The patterns are matched whole (fullmatch: "$" would also match before a
# trailing newline); the HTTP API's OpenAPI document states the same ones.
REQUEST_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
# Tenant and pool names become parts of Kubernetes object names and Redis keys,
# so they follow DNS-1123 labels.
NAME_PATTERN = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
RESOURCE_PATTERN = r"[a-z][a-z0-9_]{0,31}"
MAX_PRIORITY = 1_000_000
_ID_PATTERN = re.compile(REQUEST_ID_PATTERN)
_NAME_PATTERN = re.compile(NAME_PATTERN)
_RESOURCE_PATTERN = re.compile(RESOURCE_PATTERN)

MAX_REASON_LENGTH = 1024
MAX_REJECTED_PAYLOAD_BYTES = 1024

Cost = dict[str, int]


class RequestState(enum.StrEnum):
    WAITING = "waiting"
    RESERVED = "reserved"
    DELIVERED = "delivered"
    # Cancelled while reserved or delivered: still charged until the target
    # confirms the work stopped (docs/decisions/211).
    CANCELLING = "cancelling"
    # An admin's complete or fail of work an executor may hold: still charged until
    # the target confirms the stop, then ``completed`` / ``failed`` (docs/decisions/819).
    COMPLETING = "completing"
    FAILING = "failing"
    # Chosen as a preemption victim while reserved or delivered: still charged
    # until the target confirms the stop, then ``preempted`` (docs/fair-sharing.md).
    PREEMPTING = "preempting"
    PREEMPTED = "preempted"
    # Past its max-runtime under a tenant that stops such work: still charged
    # until the target confirms the stop, then ``timed_out`` (docs/decisions/714).
    TIMING_OUT = "timing_out"
    TIMED_OUT = "timed_out"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    REJECTED = "rejected"


CHARGED_STATES = frozenset(
    {RequestState.RESERVED, RequestState.DELIVERED, RequestState.CANCELLING,
     RequestState.COMPLETING, RequestState.FAILING, RequestState.PREEMPTING,
     RequestState.TIMING_OUT}
)
# Charged, stopping: only the target's confirmed stop ends them (or an admin's
# forced end, docs/decisions/820).
STOPPING_STATES = frozenset({RequestState.CANCELLING, RequestState.COMPLETING,
                             RequestState.FAILING, RequestState.PREEMPTING,
                             RequestState.TIMING_OUT})
FINAL_STATES = frozenset(
    {
        RequestState.COMPLETED,
        RequestState.FAILED,
        RequestState.CANCELLED,
        RequestState.EXPIRED,
        RequestState.REJECTED,
        RequestState.PREEMPTED,
        RequestState.TIMED_OUT,
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
    # Seconds, as submitted (docs/fair-sharing.md#budgets); None: none declared.
    max_runtime: int | None = None
    # The delivery attempt: 1, one more after every requeue (docs/decisions/720).
    attempt: int = 1

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
            "max_runtime": self.max_runtime,
            "attempt": self.attempt,
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
    # Seconds; what its budget reserves for it (docs/fair-sharing.md#budgets). None: not declared.
    max_runtime: int | None = None


def validate_request_id(value: object) -> str:
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
        raise InvalidInput(
            "request id must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit",
            code="invalid_request_id",
        )
    return value


def validate_name(value: object, kind: str) -> str:
    if not isinstance(value, str) or not _NAME_PATTERN.fullmatch(value):
        raise InvalidInput(
            f"{kind} name must be a DNS-1123 label: 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit",
            code=f"invalid_{kind}_name",
        )
    return value


def validate_resource(value: object) -> str:
    if not isinstance(value, str) or not _RESOURCE_PATTERN.fullmatch(value):
        raise InvalidInput(
            "resource name must be 1-32 characters of lowercase letters, digits or '_', "
            "starting with a letter",
            code="invalid_resource",
        )
    return value


def validate_amounts(
    amounts: Mapping[str, object], *, what: str, allow_zero: bool
) -> dict[str, int]:
    """Check a resource→amount mapping: names valid, amounts whole and in range.

    ``what`` is the field (``borrowing_limit``): the code's suffix, and in the sentence in
    words (``borrowing limit for 'gpu'``), the same for the CLI's option and the API's field.
    """
    words = what.replace("_", " ")
    if not isinstance(amounts, Mapping):
        raise InvalidInput(f"{words} must map resources to amounts, got {quoted(amounts)}",
                           code=f"invalid_{what}")
    if not amounts:
        raise InvalidInput(f"{words} must name at least one resource", code=f"invalid_{what}")
    checked: dict[str, int] = {}
    for resource, amount in amounts.items():
        validate_resource(resource)
        # bool is an int subclass; "gpu=true" is a mistake, not a 1.
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidInput(
                f"{words} for {quoted(resource)} must be a whole number, got {quoted(amount)}",
                code=f"invalid_{what}",
            )
        low = 0 if allow_zero else 1
        if amount < low or amount > MAX_AMOUNT:
            bound = "zero or more" if allow_zero else "at least 1"
            raise InvalidInput(
                f"{words} for {quoted(resource)} must be {bound} and at most {MAX_AMOUNT}, "
                f"got {quoted(amount)}",
                code=f"invalid_{what}",
            )
        checked[resource] = amount
    return dict(sorted(checked.items()))


def validate_limits(
    limits: Mapping[str, object], *, what: str
) -> dict[str, int | None]:
    """A resource→limit mapping where None (or "none") removes a limit."""
    if not isinstance(limits, Mapping):
        raise InvalidInput(f"{what.replace('_', ' ')} must map resources to amounts",
                           code=f"invalid_{what}")
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
        raise InvalidInput(f"{what} must be one of {', '.join(allowed)}, got {quoted(value)}",
                           code=f"invalid_{what}")
    return value


def validate_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
        -MAX_PRIORITY <= value <= MAX_PRIORITY
    ):
        raise InvalidInput(
            "priority must be a whole number between -1000000 and 1000000",
            code="invalid_priority",
        )
    return value


def nesting_depth(value: Any, *, beyond: int) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar: 0), counted without
    recursion; it stops counting once past ``beyond``."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > beyond:
                return deepest
        pending.extend((child, depth) for child in children)
    return deepest


def _payload_too_deep() -> InvalidInput:
    return InvalidInput(f"payload nests arrays and objects deeper than {MAX_PAYLOAD_DEPTH} "
                        "levels; nothing was submitted", code="invalid_payload")


def canonical_payload(payload: Any) -> str:
    """Serialise a payload so equal payloads compare equal byte for byte."""
    if nesting_depth(payload, beyond=MAX_PAYLOAD_DEPTH) > MAX_PAYLOAD_DEPTH:
        raise _payload_too_deep()
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload must be JSON: {exc}", code="invalid_payload") from exc
    # JSON may spell a lone UTF-16 surrogate ("\ud800") and the parser accepts it,
    # but no UTF-8 answer can carry one: stored, it would make every answer
    # about the request, and every listing of its tenant, fail to encode.
    check_unicode(json.dumps(payload, ensure_ascii=False), what="payload", code="invalid_payload")
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidInput(
            f"payload is larger than {MAX_PAYLOAD_BYTES} bytes", code="payload_too_large"
        )
    return text


def kept_payload(payload_json: str, state: RequestState) -> str:
    """What the ledger keeps of a canonical payload for a request in ``state``.

    A rejected request never runs, and anyone can send thousands of refused
    submits: it keeps its payload only up to :data:`MAX_REJECTED_PAYLOAD_BYTES`,
    above that only the size and digest, which is enough to tell an identical
    replay from a changed one (docs/decisions/803-bounded-refusals.md).
    """
    if state != RequestState.REJECTED or len(payload_json) <= MAX_REJECTED_PAYLOAD_BYTES:
        return payload_json
    # payload_json is ASCII (json.dumps escapes the rest): characters are bytes.
    digest = hashlib.sha256(payload_json.encode()).hexdigest()
    return json.dumps({"omitted_payload": {"bytes": len(payload_json), "sha256": digest}},
                      sort_keys=True, separators=(",", ":"))


def check_unicode(text: str, *, what: str, code: str = "invalid_input") -> None:
    """Refuse text no UTF-8 document can carry (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{what} holds a lone UTF-16 surrogate ({exc.object[exc.start]!a}): not Unicode text",
            code=code,
        ) from None


def validate_reason(value: object) -> str | None:
    """A release reason: free text, but text a database and a UTF-8 answer can hold."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_REASON_LENGTH:
        raise InvalidInput(f"reason must be text of at most {MAX_REASON_LENGTH} characters",
                           code="invalid_input")
    if "\x00" in value:
        # PostgreSQL refuses NUL in text and MariaDB would cut the reason short there.
        raise InvalidInput("reason must not contain a NUL character", code="invalid_input")
    check_unicode(value, what="reason")
    return value


def bounded_reason(text: str | None) -> str | None:
    """A reason from a target or an executor, made one :func:`validate_reason` accepts.

    Such text comes from outside (a webhook's answer, a Kubernetes status): a NUL,
    a lone surrogate or a page of text must not stop the request from ending.
    """
    if text is None:
        return None
    cleaned = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return cleaned[:MAX_REASON_LENGTH]


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
    except RecursionError:
        # The parser recurses once per level: far deeper than MAX_PAYLOAD_DEPTH anyway.
        raise _payload_too_deep() from None


def build_submission(
    *,
    request_id: object,
    tenant: object,
    cost: Mapping[str, object],
    priority: object = 0,
    payload: Any = None,
    target: str | None = None,
    max_runtime: object = None,
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
        max_runtime=None if max_runtime is None else parse_duration(max_runtime,
                                                                     what="max_runtime"),
    )
