"""Fit and best-fit placement over multi-resource costs.

``Usage`` maps a holder (tenant or pool) to ``{resource: (used, cap)}``. A
resource the holder does not list has a cap of zero.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from quotagate.domain.budget import Budgets
from quotagate.domain.fairness import FairOrder, fair_share
from quotagate.domain.model import Cost
from quotagate.domain.sharing import Sharing

ResourceUsage = dict[str, tuple[int, int]]


def remaining(usage: Mapping[str, tuple[int, int]], resource: str) -> int:
    used, cap = usage.get(resource, (0, 0))
    return cap - used


_UNLISTED = (0, 0)


def fits(cost: Cost, usage: Mapping[str, tuple[int, int]]) -> bool:
    # A loop, not all() over a generator: admission asks this of every pool and candidate.
    for resource, amount in cost.items():
        used, cap = usage.get(resource, _UNLISTED)
        if cap - used < amount:
            return False
    return True


def has_room(usage: Mapping[str, tuple[int, int]]) -> bool:
    """Has a holder room left in any resource? A loop, not any() over a generator:
    asked of every tenant and every pool at every admission."""
    for used, cap in usage.values():  # noqa: SIM110 - the loop is the point (above)
        if cap > used:
            return True
    return False


def fits_when_empty(cost: Cost, capacity: Mapping[str, int]) -> bool:
    """Whether ``cost`` fits a holder of ``capacity`` with nothing of it used: whether any
    admission could ever grant it there (docs/decisions/809)."""
    return all(capacity.get(resource, 0) >= amount for resource, amount in cost.items())


def blocking_resources(cost: Cost, usage: Mapping[str, tuple[int, int]]) -> list[str]:
    return [resource for resource, amount in cost.items() if remaining(usage, resource) < amount]


def best_fit_pool(cost: Cost, pools: Mapping[str, Mapping[str, tuple[int, int]]]) -> str | None:
    """The pool that fits ``cost`` with the least room left over, ties by name.

    Room left is summed over the resources the request asks for: keeping big
    holes whole on the dimensions that matter is what best fit is for.
    """
    best: tuple[int, str] | None = None
    items = cost.items()
    for name, usage in pools.items():
        leftover = 0
        for resource, amount in items:  # fits and the room left over, in one pass
            used, cap = usage.get(resource, _UNLISTED)
            room = cap - used - amount
            if room < 0:
                break
            leftover += room
        else:
            if best is None or (leftover, name) < best:
                best = (leftover, name)
    return None if best is None else best[1]


def charge(usage: dict[str, tuple[int, int]], cost: Cost) -> None:
    for resource, amount in cost.items():
        used, cap = usage.get(resource, _UNLISTED)
        usage[resource] = (used + amount, cap)


@dataclass(frozen=True)
class Candidate:
    id: str
    tenant: str
    cost: Cost
    # What a budget reserves for it: its max-runtime, seconds (None: none declared).
    runtime: int | None = None


@dataclass(frozen=True)
class Placement:
    id: str
    tenant: str
    pool: str
    cost: Cost
    runtime: int | None = None


class PlacementGuard(Protocol):
    """A further condition on placements (held room: quotagate.domain.preemption.HeldRoom)."""

    def allows(
        self, candidate: Candidate, pool: str,
        tenants: dict[str, dict[str, tuple[int, int]]],
        pools: dict[str, dict[str, tuple[int, int]]],
        sharing: Sharing | None, placed: set[str],
    ) -> bool: ...


def plan_admissions(
    candidates: Iterable[Candidate],
    tenants: Mapping[str, Mapping[str, tuple[int, int]]],
    pools: Mapping[str, Mapping[str, tuple[int, int]]],
    limit: int,
    sharing: Sharing | None = None,
    weights: Mapping[str, int] | None = None,
    *,
    stop_before: str | None = None,
    budgets: Budgets | None = None,
    history: Mapping[str, float] | None = None,
    guard: PlacementGuard | None = None,
) -> list[Placement]:
    """Walk candidates and place each that fits, up to ``limit``.

    ``candidates`` come in queue order (priority with aging). With ``weights``
    (fair sharing, the admission default) they are taken tenant by tenant,
    lowest weighted dominant share first (quotagate.domain.fairness), each
    tenant's own in queue order; without, in plain queue order.

    A candidate that does not fit is skipped, not waited for: smaller requests
    behind a big one are not blocked by it. A member of a cohort (``sharing``)
    fits by its nominal, borrowing limit and cohort room instead of its cap.
    Like the usages, ``sharing`` is not changed: the plan charges a copy.
    ``stop_before``: stop when that candidate's turn comes (the dry run: what is
    placed before it). ``budgets``: a budgeted tenant's request must also fit
    what its budget has left (quotagate.domain.budget); not changed either.
    ``history``: tenants' decayed past shares, blended into the fair order.
    ``guard``: a further condition every placement must meet.
    """
    sharing = sharing.copy() if sharing else None
    budgets = budgets.copy() if budgets else None
    tenant_usage = {name: dict(usage) for name, usage in tenants.items()}
    pool_usage = {name: dict(usage) for name, usage in pools.items()}
    placements: list[Placement] = []
    order: Iterator[Candidate]
    fair: FairOrder[Candidate] | None = None
    if weights is not None:
        fair = FairOrder(candidates, tenant_usage, weights, history)
        order = iter(fair)
    else:
        order = iter(candidates)
    if limit < 1:
        return placements
    for candidate in order:
        if candidate.id == stop_before:
            break
        usage = tenant_usage.get(candidate.tenant)
        if usage is not None:
            _place(candidate, usage, pool_usage, sharing, placements, budgets,
                   None if guard is None else (guard, tenant_usage))
        if len(placements) >= limit:
            break  # before the tenant goes back in line: nothing more is taken
        if fair is not None:
            fair.considered(usage or {})
    return placements


# A candidate as admission keeps it between reads: its place in queue order (queue key,
# created, id), then the candidate, then whatever the keeper adds (quotagate.store.head_rows).
# The id is unique, so such tuples compare in queue order and never by the candidate.
QueuedCandidate = tuple[Any, ...]


def place_first(
    queues: Iterable[tuple[str, Sequence[QueuedCandidate]]],
    tenants: Mapping[str, Mapping[str, tuple[int, int]]],
    pools: Mapping[str, Mapping[str, tuple[int, int]]],
    weights: Mapping[str, int],
    history: Mapping[str, float] | None,
    window: int,
) -> tuple[QueuedCandidate, str] | None:
    """The one request :func:`plan_admissions` places with ``limit=1`` and ``weights``, and
    its best-fit pool, without building the plan: for tenants outside cohorts, with no
    budget and no held room (the steady SQLite admission, quotagate.store.steady_admission).

    ``queues``: each tenant's first waiting candidates in queue order, of which the first
    ``window`` count. With one placement to make, the fair order's shares do not move
    before it is made, so the fair order hands out candidates by (the tenant's
    :func:`~quotagate.domain.fairness.fair_share`, place in queue order), and the first
    that fits its tenant and some pool is the one placed. Each tenant's candidates are
    looked at only when its turn comes, as the fair order would.
    """
    turns: list[tuple[Any, ...]] = []
    for tenant, queued in queues:
        usage = tenants.get(tenant)
        if usage is None or not queued or window < 1:
            continue
        past = history.get(tenant) if history else None
        share = fair_share(usage, weights.get(tenant, 1), past)
        first = queued[0]
        # (share, place in queue order, the tenant's index into its queue, queue, usage)
        turns.append((share, first[0], first[1], first[2], 0, queued, usage))
    heapq.heapify(turns)
    while turns:
        share, _key, _created, _id, index, queued, usage = turns[0]
        entry = queued[index]
        cost = entry[3].cost
        if fits(cost, usage):
            pool = best_fit_pool(cost, pools)
            if pool is not None:
                return entry, pool
        index += 1
        if index < window and index < len(queued):
            following = queued[index]
            heapq.heapreplace(turns, (share, following[0], following[1], following[2], index,
                                      queued, usage))
        else:
            heapq.heappop(turns)
    return None


def _place(
    candidate: Candidate,
    usage: dict[str, tuple[int, int]],
    pool_usage: dict[str, dict[str, tuple[int, int]]],
    sharing: Sharing | None,
    placements: list[Placement],
    budgets: Budgets | None = None,
    guarded: tuple[PlacementGuard, dict[str, dict[str, tuple[int, int]]]] | None = None,
) -> bool:
    if budgets is not None and not budgets.fits(candidate.tenant, candidate.cost,
                                                candidate.runtime):
        return False
    member = sharing is not None and sharing.is_member(candidate.tenant)
    if member:
        assert sharing is not None
        if not sharing.fits(candidate.tenant, candidate.cost, usage):
            return False
    elif not fits(candidate.cost, usage):
        return False
    pool = best_fit_pool(candidate.cost, pool_usage)
    if pool is None:
        return False
    if guarded is not None and not guarded[0].allows(
        candidate, pool, guarded[1], pool_usage, sharing,
        {placement.id for placement in placements},
    ):
        return False
    if member:
        assert sharing is not None
        sharing.charge(candidate.tenant, candidate.cost, usage)
    if budgets is not None:
        budgets.charge(candidate.tenant, candidate.cost, candidate.runtime)
    charge(usage, candidate.cost)
    charge(pool_usage[pool], candidate.cost)
    placements.append(Placement(candidate.id, candidate.tenant, pool, candidate.cost,
                                candidate.runtime))
    return True


def total_cost(costs: Iterable[Cost]) -> Cost:
    total: Cost = {}
    for cost in costs:
        for resource, amount in cost.items():
            total[resource] = total.get(resource, 0) + amount
    return dict(sorted(total.items()))
