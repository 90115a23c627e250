"""Keyset-paginated listings: a tenant's requests and the audit log.

A cursor is the sort key of the last row a page returned, made opaque
(base64 of JSON). Keyset pagination, unlike OFFSET, costs the same on page 100
as on page 1 and neither skips nor repeats rows when new ones arrive meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain import help_defaults
from quotagate.domain.model import Request, RequestState, validate_request_id
from quotagate.errors import InvalidInput
from quotagate.store import schema
from quotagate.store.dialect import reading
from quotagate.store.rows import request_from_row

MAX_PAGE = help_defaults.MAX_PAGE  # kept in domain.help_defaults: the CLI's help shows it


Item = TypeVar("Item")


@dataclass(frozen=True)
class Page(Generic[Item]):
    items: list[Item]
    next_cursor: str | None


class AuditRecord(TypedDict):
    """One audit log entry, as listed."""

    id: int
    at: float
    actor: str
    tenant: str | None
    operation: str
    target: str | None
    outcome: str
    reason: str | None


class Binding(TypedDict):
    """The external object a delivered request is bound to."""

    target: str
    external_name: str
    uid: str | None
    fencing_token: int
    created: float


def encode_cursor(key: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, separators=(",", ":")).encode()).decode()


# The values a cursor may carry: what this API puts in one, and nothing a
# database would refuse or compare oddly (huge numbers, NaN, infinities, NUL).
_MAX_CURSOR_TIME = 1e11  # epoch seconds: past the year 5000
_MAX_CURSOR_INT = 2**63 - 1


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number a cursor holds")


def _cursor_part_valid(part: object, kind: type) -> bool:
    if isinstance(part, bool) or not isinstance(part, kind):
        return False
    if isinstance(part, float):
        return math.isfinite(part) and 0 <= part <= _MAX_CURSOR_TIME
    if isinstance(part, int):
        return 0 <= part <= _MAX_CURSOR_INT
    if isinstance(part, str):
        try:
            validate_request_id(part)
        except InvalidInput:
            return False
    return True


def decode_cursor(text: str, shape: tuple[type, ...]) -> list[Any]:
    """The key inside a cursor, checked against the types and ranges it must have."""
    try:
        key = json.loads(base64.urlsafe_b64decode(text.encode("ascii")),
                         parse_constant=_refuse_constant)
    except (ValueError, UnicodeError, binascii.Error):
        key = None
    valid = isinstance(key, list) and len(key) == len(shape) and all(
        _cursor_part_valid(part, kind) for part, kind in zip(key, shape, strict=False)
    )
    if not valid:
        raise InvalidInput("cursor is not one this API returned", code="invalid_cursor")
    assert isinstance(key, list)
    return key


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}", code="invalid_limit")


def list_requests(
    engine: Engine,
    tenant: str,
    *,
    state: RequestState | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[Request]:
    """A tenant's requests, newest first (by created, then id)."""
    _check_limit(limit)
    request = schema.request
    query = sa.select(request).where(request.c.tenant == tenant)
    if state is not None:
        query = query.where(request.c.state == state.value)
    if cursor is not None:
        created, request_id = decode_cursor(cursor, (float, str))
        query = query.where(
            sa.or_(
                request.c.created < created,
                sa.and_(request.c.created == created, request.c.id < request_id),
            )
        )
    query = query.order_by(request.c.created.desc(), request.c.id.desc()).limit(limit + 1)
    with reading(engine) as connection:
        rows = connection.execute(query).mappings().all()
    requests: list[Request] = [request_from_row(dict(row)) for row in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = requests[-1]
        next_cursor = encode_cursor([float(last.created), last.id])
    return Page(requests, next_cursor)


def list_audit(
    engine: Engine,
    *,
    tenant: str | None = None,
    request: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[AuditRecord]:
    """Audit entries, newest first; only ``tenant``'s when given.

    With ``request``, only the entries about that request of its own tenant: a refusal
    of another tenant's caller that named this id is audited under that caller's tenant
    (docs/decisions/606), and is that tenant's record, not this request's story.
    """
    _check_limit(limit)
    audit, requests = schema.audit, schema.request
    query = sa.select(audit)
    if tenant is not None:
        query = query.where(audit.c.tenant == tenant)
    if request is not None:
        owner = sa.select(requests.c.tenant).where(requests.c.id == request).scalar_subquery()
        query = query.where(audit.c.target == request, audit.c.tenant == owner)
    if cursor is not None:
        (before,) = decode_cursor(cursor, (int,))
        query = query.where(audit.c.id < before)
    query = query.order_by(audit.c.id.desc()).limit(limit + 1)
    with reading(engine) as connection:
        rows = [audit_record(row) for row in connection.execute(query).mappings()]
    next_cursor = encode_cursor([rows[limit - 1]["id"]]) if len(rows) > limit else None
    return Page(rows[:limit], next_cursor)


def audit_record(row: Any) -> AuditRecord:
    return AuditRecord(
        id=int(row["id"]), at=float(row["at"]), actor=row["actor"], tenant=row["tenant"],
        operation=row["operation"], target=row["target"], outcome=row["outcome"], reason=row["reason"],
    )


def read_binding(engine: Engine, request_id: str) -> Binding | None:
    """The external object a delivered request is bound to, if any."""
    binding = schema.binding
    with reading(engine) as connection:
        row = connection.execute(
            sa.select(binding).where(binding.c.request_id == request_id)
        ).mappings().first()
    if row is None:
        return None
    return Binding(
        target=row["target"], external_name=row["external_name"], uid=row["uid"],
        fencing_token=int(row["fencing_token"]), created=float(row["created"]),
    )
