"""Snapshots of everything the ledger stores, to prove that a refused call changed nothing."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.store import schema

_TABLES = (schema.request, schema.tenant_quota, schema.pool_capacity, schema.outbox,
           schema.tenant, schema.pool)


def snapshot(gate: Quotagate) -> dict[str, Any]:
    with gate.engine.connect() as connection:
        return {
            table.name: sorted(
                tuple(row) for row in connection.execute(sa.select(table))
            )
            for table in _TABLES
        }


def count(gate: Quotagate, table: sa.Table, *conditions: Any) -> int:
    with gate.engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(table).where(*conditions)
        ).scalar_one())
