"""What the ledger remembers of one request's delivery, read for ``quotagate diagnose``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.store import schema
from quotagate.store.dialect import reading


@dataclass(frozen=True)
class DeliveryTrail:
    """The outbox row, the binding and the audit entries of one request."""

    outbox: dict[str, Any] | None
    binding: dict[str, Any] | None
    audit: list[dict[str, Any]] = field(default_factory=list)


def delivery_trail(engine: Engine, request_id: str, *, audit_limit: int = 50) -> DeliveryTrail:
    outbox, binding, audit = schema.outbox, schema.binding, schema.audit
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
        entries = connection.execute(
            sa.select(audit.c.at, audit.c.actor, audit.c.operation, audit.c.outcome, audit.c.reason)
            .where(audit.c.target == request_id)
            .order_by(audit.c.id).limit(audit_limit)
        ).mappings().all()
    return DeliveryTrail(
        None if outbox_row is None else dict(outbox_row),
        None if binding_row is None else dict(binding_row),
        [dict(entry) for entry in entries],
    )
