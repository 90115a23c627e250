"""What the ledger remembers of one request's delivery and audit, read for ``quotagate diagnose``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.store import schema
from quotagate.store.dialect import reading
from quotagate.store.listing import AuditRecord, audit_record


@dataclass(frozen=True)
class DeliveryTrail:
    """The outbox row and the binding of one request."""

    outbox: dict[str, Any] | None
    binding: dict[str, Any] | None


@dataclass(frozen=True)
class AuditTrail:
    """Who did what to one request, and when: its newest audit entries, oldest first."""

    entries: list[AuditRecord]
    earlier: bool  # older entries exist that are not in ``entries``


def delivery_trail(engine: Engine, request_id: str) -> DeliveryTrail:
    outbox, binding = schema.outbox, schema.binding
    with reading(engine) as connection:
        outbox_row = connection.execute(
            sa.select(outbox.c.attempts, outbox.c.delivered, outbox.c.delivered_at, outbox.c.claimed_by,
                      outbox.c.claim_generation, outbox.c.claim_token, outbox.c.last_error)
            .where(outbox.c.request_id == request_id)
        ).mappings().first()
        binding_row = connection.execute(
            sa.select(binding.c.target, binding.c.external_name, binding.c.uid, binding.c.fencing_token)
            .where(binding.c.request_id == request_id)
        ).mappings().first()
    return DeliveryTrail(
        None if outbox_row is None else dict(outbox_row),
        None if binding_row is None else dict(binding_row),
    )


def audit_trail(engine: Engine, request_id: str, *, tenant: str | None = None,
                limit: int = 50) -> AuditTrail:
    """The newest ``limit`` audit entries about ``request_id``, oldest first.

    Only entries of the request's own tenant: a refusal of another tenant's caller that
    named this id is audited under that caller's tenant (docs/decisions/606), and is that
    tenant's record, not this request's story. With ``tenant``, nothing unless the request
    is that tenant's.
    """
    audit, request = schema.audit, schema.request
    owner = sa.select(request.c.tenant).where(request.c.id == request_id).scalar_subquery()
    query = sa.select(audit).where(audit.c.target == request_id, audit.c.tenant == owner)
    if tenant is not None:
        query = query.where(audit.c.tenant == tenant)
    with reading(engine) as connection:
        rows = connection.execute(query.order_by(audit.c.id.desc()).limit(limit + 1)).mappings().all()
    entries = [audit_record(row) for row in rows[:limit]]
    return AuditTrail(entries[::-1], earlier=len(rows) > limit)
