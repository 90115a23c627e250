"""What the ledger remembers of one request's delivery and audit, read for ``quotagate diagnose``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.store import schema
from quotagate.store.dialect import reading
from quotagate.store.listing import AuditRecord, list_audit


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
                      outbox.c.claim_generation, outbox.c.claim_token, outbox.c.last_error,
                      outbox.c.stop_progress)
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

    The listing's page (``list_audit`` with ``request``): only entries of the request's own
    tenant; with ``tenant``, nothing unless the request is that tenant's.
    """
    page = list_audit(engine, tenant=tenant, request=request_id, limit=limit)
    return AuditTrail(page.items[::-1], earlier=page.next_cursor is not None)
