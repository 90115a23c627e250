"""Several admitters on different tenants: claim the quota rows no other admitter holds.

Capacity slices (:mod:`quotagate.store.pool_slices`) let concurrent admitters
charge a pool on different rows, but every batch also charges its tenants'
quota rows, and a batch spans every open tenant: the second admitter would
still queue on the first one's tenant rows until it commits. So where some
pool is sliced (the ledger runs several admitters), an admission first locks
the quota rows of the plain tenants it may serve with ``FOR UPDATE SKIP
LOCKED`` — those with waiting requests at the head it read — and plans only
for the tenants whose rows it got, leaving the others to the admitters
charging them right now (docs/decisions/030-admitters-claim-tenants.md).

Without a sliced pool nothing here runs: one admitter, today's statements.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.store import schema
from quotagate.store.dialect import supports_skip_locked
from quotagate.store.driver import DriverTransaction

__all__ = ["ClaimsTooNarrow", "claim_tenants"]


class ClaimsTooNarrow(Exception):
    """The claimed tenants had nothing to admit while others were left out: roll back and
    run the admission once without claims, taking tenant rows in order like before."""


@lru_cache(maxsize=64)
def _claim_query(count: int) -> sa.Select[Any]:
    """Lock the quota rows of ``count`` tenants (``tenant_0`` …) that nobody holds."""
    quota = schema.tenant_quota
    return (
        sa.select(quota.c.tenant, quota.c.resource)
        .where(quota.c.tenant.in_([sa.bindparam(f"tenant_{index}") for index in range(count)]))
        .order_by(quota.c.tenant, quota.c.resource)
        .with_for_update(skip_locked=True)
    )


def claim_tenants(
    transaction: DriverTransaction,
    tenants: Sequence[str],
    usage: Mapping[str, Mapping[str, tuple[int, int]]],
    members: Collection[str],
) -> list[str]:
    """The tenants of ``tenants`` this admission may plan for, their quota rows now locked.

    Cohort ``members`` are kept as they are (their rows and their cohort's
    room are charged by :mod:`quotagate.store.cohorts`, waiting in its order).
    A plain tenant is kept if every one of its quota rows was free to lock.
    If those kept admit nothing while some were left out, the ledger raises
    :class:`ClaimsTooNarrow`, rolls back (giving up every claim, also the
    rows of a tenant only partly had) and runs once without claims, waiting
    in the usual order: an admission must not answer "nothing fits" only
    because other admitters were busy, nor wait while holding claims.
    """
    plain = [tenant for tenant in tenants if tenant not in members]
    if not plain or not supports_skip_locked(transaction):
        return list(tenants)
    parameters = {f"tenant_{index}": tenant for index, tenant in enumerate(plain)}
    locked: dict[str, set[str]] = {}
    for tenant, resource in transaction.rows(_claim_query(len(plain)), parameters):
        locked.setdefault(tenant, set()).add(resource)
    got = {tenant for tenant in plain if locked.get(tenant, set()) >= set(usage.get(tenant, {}))}
    return [tenant for tenant in tenants if tenant in got or tenant in members]
