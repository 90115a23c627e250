"""Audit log writes, always inside the transaction whose decision they record."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from quotagate.store import schema


@dataclass(frozen=True)
class AuditEntry:
    actor: str
    operation: str
    outcome: str
    tenant: str | None = None
    target: str | None = None
    reason: str | None = None


def record(connection: sa.Connection, at: float, *entries: AuditEntry) -> None:
    if not entries:
        return
    connection.execute(
        schema.audit.insert(),
        [
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
        ],
    )
