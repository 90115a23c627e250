"""Decayed past use for fair sharing with a half-life (docs/decisions/712).

The half-life is one setting of the whole ledger (a ``qg_meta`` row), so every
admitter orders tenants alike. Each quota row keeps the tenant's past use of
the resource, decayed to when it was last written; a release adds what the
released work held (:func:`quotagate.domain.fairness.held_decayed`) on the
quota rows it has just given the cost back to, whose locks it holds already.
Admission reads it with the rest of its snapshot and blends it into the fair
order (:func:`history`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.fairness import decayed, held_decayed, past_share
from quotagate.store import schema
from quotagate.store.cohorts import Snapshot
from quotagate.store.driver import DriverTransaction
from quotagate.store.rows import decode_cost
from quotagate.store.statements import HALF_LIFE_KEY

__all__ = ["accrue", "half_life", "history", "set_half_life"]


@lru_cache(maxsize=1)
def _half_life_query() -> sa.Select[Any]:
    meta = schema.ledger_meta
    return sa.select(meta.c.value).where(meta.c.key == HALF_LIFE_KEY)


def half_life(transaction: sa.Connection | DriverTransaction) -> int | None:
    """The fair-share half-life in seconds, or None; every release asks (on the driver)."""
    # Both kinds answer execute(statement, parameters) with rows to fetch.
    rows = transaction.execute(_half_life_query(), {}).fetchall()
    value = rows[0][0] if rows else None
    return None if value is None else int(value)


def set_half_life(connection: sa.Connection, seconds: int | None) -> None:
    """Set (or with None remove) the half-life; past use recorded so far is forgotten, since
    it was decayed at another rate."""
    meta, quota = schema.ledger_meta, schema.tenant_quota
    connection.execute(meta.delete().where(meta.c.key == HALF_LIFE_KEY))
    if seconds is not None:
        connection.execute(meta.insert().values(key=HALF_LIFE_KEY, value=str(seconds)))
    connection.execute(quota.update().where(quota.c.decayed != 0)
                       .values(decayed=0.0, decayed_at=None))


def history(snapshot: Snapshot, now: float) -> dict[str, float] | None:
    """Each tenant's decayed past share, from the admission snapshot; None without a half-life."""
    if snapshot.half_life is None:
        return None
    return {tenant: past_share(use, snapshot.tenants.get(tenant, {}), snapshot.half_life, now)
            for tenant, use in snapshot.decayed.items()}


def accrue(connection: sa.Connection, transaction: DriverTransaction,
           rows: Iterable[Mapping[str, Any]], now: float) -> None:
    """Released requests' held time into their tenants' decayed past use (with a half-life).

    ``rows``: the locked request rows whose cost came back. Their tenants' quota
    rows were just updated by the return, in this transaction: their locks are
    held, so reading and writing them here races with nobody. Whether there is a
    half-life is read on ``transaction`` (every release asks); the rare writes go
    through ``connection``, the same transaction (docs/decisions/246).
    """
    added: dict[tuple[str, str], float] = defaultdict(float)
    rows = list(rows)
    if not rows:
        return
    seconds = half_life(transaction)
    if seconds is None:
        return
    for row in rows:
        if row["admitted"] is None:
            continue
        held = now - float(row["admitted"])
        for resource, amount in decode_cost(row["cost"]).items():
            added[row["tenant"], resource] += held_decayed(amount, held, seconds)
    quota = schema.tenant_quota
    for (tenant, resource), held_use in sorted(added.items()):
        where = (quota.c.tenant == tenant, quota.c.resource == resource)
        current = connection.execute(
            sa.select(quota.c.decayed, quota.c.decayed_at).where(*where).with_for_update()
        ).first()
        if current is None:
            continue
        value = decayed(float(current.decayed), current.decayed_at, now, seconds) + held_use
        connection.execute(quota.update().where(*where).values(decayed=value, decayed_at=now))
