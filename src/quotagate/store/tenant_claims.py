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

That claim takes *every* free waiting tenant, and a fair batch spans every
tenant: the first of several admitters took them all and the others rolled
back and queued behind it. So once an admitter sees another one at work — a
request it planned was held by someone else (SKIP LOCKED skipped it), a
claim skipped a tenant, a charge missed — it *narrows* for a while
(:class:`Contention`): it claims plain tenants one at a time in fair-share
order (lowest dominant share first), skipping those another admitter holds,
reads only the claimed tenants' heads and stops claiming once its batch is
full. Admitters then work on disjoint tenants, whatever the pools' slices
(docs/decisions/044-admitters-narrow-to-disjoint-tenants.md). On PostgreSQL
:func:`claim_first` tries the tenants and reads the heads of the one it got in
one statement (docs/decisions/046-claim-and-heads-in-one-statement.md).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.fairness import dominant_share
from quotagate.domain.model import RequestState
from quotagate.store import schema
from quotagate.store.dialect import locks_in_lateral_join, supports_skip_locked
from quotagate.store.driver import DriverTransaction

__all__ = ["Claim", "ClaimsTooNarrow", "Contention", "DryQueues", "FirstClaim", "claim_first",
           "claim_tenant", "claim_tenants", "fair_order"]


class ClaimsTooNarrow(Exception):
    """The claimed tenants had nothing to admit while others were left out: roll back and
    run the admission once more, waiting for each tenant's rows in name order."""


@lru_cache(maxsize=64)
def _claim_query(count: int, skip_locked: bool = True) -> sa.Select[Any]:
    """Lock the quota rows of ``count`` tenants (``tenant_0`` …) that nobody holds
    (or, without ``skip_locked``, wait for them)."""
    quota = schema.tenant_quota
    return (
        sa.select(quota.c.tenant, quota.c.resource)
        .where(quota.c.tenant.in_([sa.bindparam(f"tenant_{index}") for index in range(count)]))
        .order_by(quota.c.tenant, quota.c.resource)
        .with_for_update(skip_locked=skip_locked)
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
    rows of a tenant only partly had) and runs once more holding nothing,
    waiting for each tenant in name order: an admission must not answer
    "nothing fits" only because other admitters were busy, nor wait while
    holding claims.
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


# How long an admitter stays narrow after it last saw another admitter. Long
# enough to span many admissions (a few milliseconds each), short enough that
# an admitter left alone soon plans fair batches over every tenant again.
NARROW_SECONDS = 1.0


class Contention:
    """When this admitter last saw another one at work; narrow while that is recent.

    One per :class:`~quotagate.store.ledger.Ledger` (shared by its threads,
    which are admitters to each other too).
    """

    def __init__(self, seconds: float = NARROW_SECONDS) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._last = float("-inf")

    def seen(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    def recent(self) -> bool:
        with self._lock:
            return time.monotonic() - self._last < self.seconds


def fair_order(
    tenants: Sequence[str],
    usage: Mapping[str, Mapping[str, tuple[int, int]]],
    weights: Mapping[str, int],
    history: Mapping[str, float] | None = None,
) -> list[str]:
    """``tenants`` lowest weighted dominant share first, as the planner serves them
    (quotagate.domain.fairness.FairOrder; its past shares blended in), ties by name."""
    past = history or {}

    def share(tenant: str) -> float:
        weight = weights.get(tenant, 1)
        return dominant_share(usage.get(tenant, {}), weight) + past.get(tenant, 0.0) / max(
            weight, 1)

    return sorted(tenants, key=lambda tenant: (share(tenant), tenant))


class DryQueues:
    """The tenants whose queue this admitter last read empty (one per Ledger, shared by
    its threads).

    A tenant with room but nothing waiting is still an open tenant of the snapshot.
    Claimed as any other, its rows are locked for nothing, and an admitter holding
    them may no longer wait for a held tenant (the lock order): at the tail of a
    drain, with fewer tenants left than admitters, that rolled back and ran again
    (``claims_too_narrow``) at most admissions. A tenant read empty is claimed
    with :func:`claim_tenant`'s ``dry`` from then on until it has work again. The
    others keep the plain claim: asking every tenant whether it waits would walk
    its queue's index once more at each claim.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: set[str] = set()

    def read(self, tenant: str, empty: bool) -> None:
        with self._lock:
            if empty:
                self._tenants.add(tenant)
            else:
                self._tenants.discard(tenant)

    def __contains__(self, tenant: object) -> bool:
        with self._lock:
            return tenant in self._tenants


class Claim(enum.Enum):
    """What :func:`claim_tenant` got of one tenant's quota rows."""

    CLAIMED = "claimed"  # every row: plan for the tenant
    SKIPPED = "skipped"  # none: another transaction holds them
    PARTLY = "partly"  # some, held until the transaction ends but not planned for
    EMPTY = "empty"  # nothing waits in its queue: no row locked, nothing to read


@lru_cache(maxsize=4)
def _claim_waiting_query(skip_locked: bool) -> sa.TextClause:
    """Lock one tenant's quota rows only if some request of it waits (PostgreSQL).

    No row: nothing waits. One row with a NULL resource: another transaction holds
    every quota row. Otherwise the rows got. One round trip, as the plain claim,
    and a tenant whose queue ran dry is neither locked nor read.
    """
    lock = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
    return sa.text(
        f"SELECT claimed.resource FROM (SELECT 1 AS present WHERE (SELECT id FROM "
        f"{schema.request.name} WHERE tenant = :tenant_0 AND state = :waiting"
        # The head read's order and a scalar subquery (EXISTS would drop both): the
        # head read's index, not a scan of every tenant's requests.
        " ORDER BY queue_key, created, id LIMIT 1) IS NOT NULL"
        f") AS waiting LEFT JOIN LATERAL (SELECT resource FROM {schema.tenant_quota.name} "
        f"WHERE tenant = :tenant_0 ORDER BY resource {lock}) AS claimed ON true"
    )


@lru_cache(maxsize=1)
def _waits_query() -> sa.Select[Any]:
    """The first waiting request of one tenant, by the head read's index (MySQL, MariaDB)."""
    request = schema.request
    return (
        sa.select(request.c.id)
        .where(request.c.tenant == sa.bindparam("tenant_0"),
               request.c.state == RequestState.WAITING.value)
        .order_by(request.c.queue_key, request.c.created, request.c.id)
        .limit(1)
    )


def claim_tenant(
    transaction: DriverTransaction, tenant: str, resources: Collection[str], *,
    wait: bool = False, dry: bool = False,
) -> Claim:
    """Lock every quota row of one plain tenant unless another transaction holds one.

    ``CLAIMED`` when all of ``resources`` (its rows in the snapshot) were got.
    With ``dry`` (its queue was last read empty, :class:`DryQueues`), ``EMPTY``
    when still nothing of the tenant waits, its rows then left alone: asked in
    the claim's statement on PostgreSQL, in one statement before it on MySQL and
    MariaDB (no ``LATERAL``). A
    tenant only partly got is not planned for; the rows got stay locked until
    the transaction ends, never waited for (as :func:`claim_tenants`). With
    ``wait`` the rows are waited for: only where the transaction holds no
    tenant row that a waiter in the lock order could want after these.
    """
    if not supports_skip_locked(transaction):
        return Claim.CLAIMED
    if dry and locks_in_lateral_join(transaction):
        rows = transaction.rows(_claim_waiting_query(not wait),
                                {"tenant_0": tenant, "waiting": RequestState.WAITING.value})
        if not rows:
            return Claim.EMPTY
        got = {resource for (resource,) in rows if resource is not None}
    else:
        if dry and not transaction.rows(_waits_query(), {"tenant_0": tenant}):
            return Claim.EMPTY  # asked apart, before any lock: one round trip more
        got = {resource for _tenant, resource in transaction.rows(
            _claim_query(1, skip_locked=not wait), {"tenant_0": tenant})}
    if got >= set(resources):
        return Claim.CLAIMED
    return Claim.PARTLY if got else Claim.SKIPPED


# Whether a tenant has work, for the tenants of :func:`_claim_first_query` last read
# empty: the head read's order and a scalar subquery, so the head index is read
# (an EXISTS would drop the order and PostgreSQL scanned every tenant's requests).
_WAITS = (
    "(NOT {alias}.dry OR (SELECT id FROM {request} WHERE tenant = {alias}.tenant"
    " AND state = :waiting ORDER BY queue_key, created, id LIMIT 1) IS NOT NULL)"
)
_TRIED = (
    "unnest(CAST(:tenants AS TEXT[]), CAST(:dry AS BOOLEAN[])) WITH ORDINALITY"
    " AS {alias}(tenant, dry, rank)"
)


@lru_cache(maxsize=8)
def _claim_first_query(window: int) -> sa.TextClause:
    """Claim the first of ``:tenants`` (in that order) whose quota rows nobody holds and
    read its heads, in one statement (PostgreSQL).

    The tenants are tried one after another (a nested loop under ``LIMIT 1``): each
    one's rows are locked with SKIP LOCKED only if it may have work (``:dry`` false,
    or some request of it waits), and the loop stops at the first tenant of which
    some row was got, or at the last one. The tenants before it that had work were
    held by others: counted (``skipped``) and the first of them named (its rank).
    One row per head of the tenant got (one with NULL heads if it has none, or if
    nothing was got). The OFFSET 0 fences keep PostgreSQL from copying the locking
    subquery into every expression that reads its result (it locked twice).
    """
    request, quota = schema.request.name, schema.tenant_quota.name
    waits_before = _WAITS.format(alias="before", request=request)
    before = (f"FROM {_TRIED.format(alias='before')} WHERE before.rank < tried.rank"
              f" AND {waits_before}")
    held_here = "tried.got IS NULL AND tried.waits"
    return sa.text(
        "SELECT pick.rank, pick.got, pick.skipped, pick.first_held, head.id, head.tenant,"
        " head.cost, head.queue_key, head.created, head.target, head.reserved_runtime,"
        " head.token_floor FROM ("
        f"SELECT tried.rank, tried.tenant, tried.got, (SELECT count(*) {before})"
        f" + CASE WHEN {held_here} THEN 1 ELSE 0 END AS skipped,"
        f" COALESCE((SELECT min(before.rank) {before}),"
        f" CASE WHEN {held_here} THEN tried.rank END) AS first_held FROM ("
        f"SELECT t.rank, t.tenant, asked.waits, held.got FROM {_TRIED.format(alias='t')}"
        f" CROSS JOIN LATERAL (SELECT {_WAITS.format(alias='t', request=request)} AS waits"
        " OFFSET 0) AS asked"
        " CROSS JOIN LATERAL (SELECT array_agg(resource) AS got FROM (SELECT resource"
        f" FROM {quota} WHERE tenant = t.tenant AND asked.waits ORDER BY resource"
        " FOR UPDATE SKIP LOCKED) AS locked OFFSET 0) AS held"
        " WHERE held.got IS NOT NULL OR t.rank = :count LIMIT 1"
        ") AS tried OFFSET 0) AS pick"
        f" LEFT JOIN LATERAL (SELECT id, tenant, cost, queue_key, created, target,"
        f" reserved_runtime, token_floor FROM {request} WHERE tenant = pick.tenant"
        f" AND state = :waiting ORDER BY queue_key, created, id LIMIT {int(window)})"
        " AS head ON pick.got IS NOT NULL"
    )


@dataclass(frozen=True)
class FirstClaim:
    """What :func:`claim_first` got: the first tenant some of whose rows it locked."""

    index: int | None  # into the tenants asked; None: none of their rows was free
    claim: Claim  # CLAIMED (plan for it) or PARTLY (held, not planned); SKIPPED if none
    skipped: int  # tenants before it (or of all, if none) with work, held by others
    first_held: int | None  # the first of those, an index into the tenants asked
    heads: list[Any]  # its heads, in the head read's columns (CLAIMED only)


def claim_first(
    transaction: DriverTransaction, tenants: Sequence[str],
    resources: Mapping[str, Collection[str]], dry: Collection[str], window: int,
) -> FirstClaim:
    """Claim the first of ``tenants`` (in the order given) that no other transaction holds
    and read its first ``window`` waiting requests: one round trip (PostgreSQL only,
    :func:`~quotagate.store.dialect.locks_in_lateral_join`).

    As :func:`claim_tenant` tried on each in turn, stopping at the first one with
    some row got: a tenant of ``dry`` with nothing waiting is neither locked nor
    counted; one partly got is ``PARTLY`` (its rows stay locked, the caller goes
    on with the tenants after it).
    """
    rows = transaction.rows(_claim_first_query(window), {
        "tenants": list(tenants), "dry": [tenant in dry for tenant in tenants],
        "count": len(tenants), "waiting": RequestState.WAITING.value})
    rank, got, skipped, first_held = rows[0][:4]
    held = None if first_held is None else int(first_held) - 1
    if got is None:
        return FirstClaim(None, Claim.SKIPPED, int(skipped), held, [])
    index = int(rank) - 1
    if not set(got) >= set(resources[tenants[index]]):
        return FirstClaim(index, Claim.PARTLY, int(skipped), held, [])
    heads = [row[4:] for row in rows if row[4] is not None]
    return FirstClaim(index, Claim.CLAIMED, int(skipped), held, heads)
