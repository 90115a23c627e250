"""Audit log writes, always inside the transaction whose decision they record."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sqlalchemy as sa

from quotagate.store import schema
from quotagate.store.driver import DriverTransaction


@dataclass(frozen=True)
class AuditEntry:
    actor: str
    operation: str
    outcome: str
    tenant: str | None = None
    target: str | None = None
    reason: str | None = None


@lru_cache(maxsize=1)
def _insert() -> sa.Insert:
    """One audit row; built once, so the driver path compiles it once (docs/decisions/246)."""
    return schema.audit.insert().values(
        at=sa.bindparam("at", type_=sa.Double), actor=sa.bindparam("actor"),
        tenant=sa.bindparam("tenant"), operation=sa.bindparam("operation"),
        target=sa.bindparam("target"), outcome=sa.bindparam("outcome"),
        reason=sa.bindparam("reason"),
    )


def record(transaction: sa.Connection | DriverTransaction, at: float,
           *entries: AuditEntry) -> None:
    if not entries:
        return
    rows = [
        {
            "at": at,
            "actor": entry.actor,
            "tenant": entry.tenant,
            "operation": entry.operation,
            "target": entry.target,
            "outcome": entry.outcome,
            "reason": None if entry.reason is None else entry.reason[:1024],
        }
        for entry in entries
    ]
    if isinstance(transaction, sa.Connection):
        transaction.execute(_insert(), rows)
    else:
        transaction.executemany(_insert(), rows)
