"""Small reads and one write over the ledger tables, for the facade's callers.

The CLI, the HTTP API and the demo ask these through ``Quotagate``; none of
them touches ``schema`` (docs/architecture.md: SQL lives under ``store/``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import reading, run_transaction

__all__ = ["audit_size", "created_at", "ping", "record_audit", "schema_present", "state_counts"]


def state_counts(engine: Engine) -> dict[str, int]:
    """How many requests are in each state (states with none are absent)."""
    request = schema.request
    with reading(engine) as connection:
        rows = connection.execute(
            sa.select(request.c.state, sa.func.count()).group_by(request.c.state)
        ).all()
    return {str(state): int(count) for state, count in rows}


def audit_size(engine: Engine) -> int:
    """How many entries the audit log holds."""
    with reading(engine) as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(schema.audit)).scalar_one())


def created_at(engine: Engine, request_ids: Sequence[str]) -> dict[str, float]:
    """When each of ``request_ids`` was submitted (unknown ids are absent)."""
    if not request_ids:
        return {}
    request = schema.request
    # One primary-key read that takes no lock, after every admission pass (the
    # admission-wait metric): no transaction around it, which on PostgreSQL saves
    # the BEGIN, SET and ROLLBACK round trips (docs/decisions/056).
    with reading(engine, single_statement=True) as connection:
        rows = connection.execute(
            sa.select(request.c.id, request.c.created).where(request.c.id.in_(list(request_ids)))
        ).all()
    return {str(request_id): float(created) for request_id, created in rows}


def schema_present(engine: Engine) -> bool:
    """True once the ledger schema exists in the database."""
    return sa.inspect(engine).has_table(schema.request.name)


def ping(engine: Engine) -> None:
    """One round trip; raises (SQLAlchemyError, StoreUnavailable) if the database does not answer."""
    with reading(engine) as connection:
        connection.execute(sa.text("SELECT 1"))


def record_audit(engine: Engine, at: float, entry: AuditEntry) -> None:
    """Record one entry in a transaction of its own (a decision that wrote nothing else)."""
    run_transaction(engine, lambda connection: record(connection, at, entry))
