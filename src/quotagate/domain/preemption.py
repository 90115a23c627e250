"""Which running work to stop so a waiting request fits: the choice, pure.

Two kinds (docs/fair-sharing.md#preemption), both Kueue's:

- **reclaim**: a cohort member whose request fits within its own nominal but not
  in the room, because others borrow, takes borrowed work back — only the part
  above each victim tenant's nominal, lowest priority first, then most recently
  admitted (``reclaim: any``, or only lower priority than the request's);
- **within the tenant**: its own running work of lower priority.

Victims are added until the request would fit once their cost is back, then
every victim not needed is dropped again: never more than needed. The cost of
work already being stopped counts as coming back, so while a preemption is in
flight nothing more is chosen (no preemption loops). A preemptor whose room is
held (docs/decisions/721) counts as having taken it, and a requeued victim never
chooses its own preemptor (docs/decisions/722).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from quotagate.domain.model import Cost
from quotagate.domain.placement import Candidate, best_fit_pool, charge, fits
from quotagate.domain.sharing import Sharing, shared_delta

Usage = dict[str, dict[str, tuple[int, int]]]

# The kinds of preemption; a victim's reason starts ``preempted (KIND) by``.
PREEMPTION_KINDS = ("reclaim", "within-tenant")


@dataclass(frozen=True)
class Running:
    """A charged request: a possible victim, or (``stopping``) one already on its way out."""

    id: str
    tenant: str
    pool: str
    cost: Cost
    priority: int
    admitted: float
    stopping: bool = False


@dataclass(frozen=True)
class Preemption:
    preemptor: str
    victims: tuple[Running, ...]
    kind: str  # "reclaim" or "within-tenant"


@dataclass
class _State:
    tenants: Usage
    pools: Usage
    sharing: Sharing

    def copy(self) -> _State:
        return _State({name: dict(usage) for name, usage in self.tenants.items()},
                      {name: dict(usage) for name, usage in self.pools.items()},
                      self.sharing.copy())

    def give_back(self, work: Running) -> None:
        """Return ``work``'s cost to its tenant, its cohort's room and its pool."""
        usage = self.tenants.setdefault(work.tenant, {})
        sharing = self.sharing
        if sharing.is_member(work.tenant):
            room = sharing.cohorts.setdefault(sharing.roots[work.tenant], {})
            for resource, amount in work.cost.items():
                limits = sharing.limits.get((work.tenant, resource))
                if limits is not None:
                    used_room, cap_room = room.get(resource, (0, 0))
                    delta = shared_delta(limits, usage.get(resource, (0, 0))[0], -amount)
                    room[resource] = (used_room + delta, cap_room)
        for holder in (usage, self.pools.setdefault(work.pool, {})):
            for resource, amount in work.cost.items():
                used, cap = holder.get(resource, (0, 0))
                holder[resource] = (used - amount, cap)

    def take(self, candidate: Candidate, pool: str) -> None:
        """Charge ``candidate`` to its tenant (and its cohort's room) and to ``pool``."""
        usage = self.tenants.setdefault(candidate.tenant, {})
        if self.sharing.is_member(candidate.tenant):
            self.sharing.charge(candidate.tenant, candidate.cost, usage)
        charge(usage, candidate.cost)
        charge(self.pools.setdefault(pool, {}), candidate.cost)

    def take_if_it_fits(self, candidate: Candidate) -> bool:
        if not self.admits(candidate):
            return False
        pool = best_fit_pool(candidate.cost, self.pools)
        assert pool is not None
        self.take(candidate, pool)
        return True

    def admits(self, candidate: Candidate) -> bool:
        usage = self.tenants.get(candidate.tenant, {})
        if self.sharing.is_member(candidate.tenant):
            tenant_fits = self.sharing.fits(candidate.tenant, candidate.cost, usage)
        else:
            tenant_fits = fits(candidate.cost, usage)
        return tenant_fits and best_fit_pool(candidate.cost, self.pools) is not None


def _within_nominal(candidate: Candidate, usage: Mapping[str, tuple[int, int]]) -> bool:
    return all(usage.get(resource, (0, 0))[0] + amount <= usage.get(resource, (0, 0))[1]
               for resource, amount in candidate.cost.items())


def _victims_for(
    candidate: Candidate, priority: int, kind: str, policy: str, state: _State,
    running: Sequence[Running], spared: str | None,
) -> list[Running]:
    sharing = state.sharing
    if kind == "reclaim":
        root = sharing.roots.get(candidate.tenant)
        pool = [work for work in running
                if work.tenant != candidate.tenant and sharing.roots.get(work.tenant) == root]
    else:
        pool = [work for work in running if work.tenant == candidate.tenant]
    if policy == "lower-priority":
        pool = [work for work in pool if work.priority < priority]
    if spared is not None:
        # A requeued victim does not stop the request that stopped it: no ping-pong.
        pool = [work for work in pool if work.id != spared]
    # Lowest priority first, then the most recently admitted.
    return sorted(pool, key=lambda work: (work.priority, -work.admitted, work.id))


def _borrows(state: _State, tenant: str) -> bool:
    usage = state.tenants.get(tenant, {})
    return any(used > nominal for used, nominal in usage.values())


def _choose(
    candidate: Candidate, kind: str, ordered: list[Running], state: _State
) -> tuple[Running, ...] | None:
    trial = state.copy()
    chosen: list[Running] = []
    for work in ordered:
        # Reclaim takes back only what is borrowed: a tenant at or below its
        # nominal keeps the rest of its work.
        if kind == "reclaim" and not _borrows(trial, work.tenant):
            continue
        trial.give_back(work)
        chosen.append(work)
        if trial.admits(candidate):
            break
    else:
        return None
    # Never more than needed: drop, latest first, every victim the request fits without.
    for work in reversed(list(chosen)):
        others = [victim for victim in chosen if victim is not work]
        without = state.copy()
        for victim in others:
            without.give_back(victim)
        if without.admits(candidate):
            chosen = others
    return tuple(chosen)


def choose_preemption(
    candidates: Iterable[Candidate],
    priorities: Mapping[str, int],
    *,
    tenants: Usage,
    pools: Usage,
    sharing: Sharing,
    policies: Mapping[str, tuple[str, str]],
    running: Sequence[Running],
    spared: Mapping[str, str] | None = None,
    holders: Sequence[Candidate] = (),
) -> Preemption | None:
    """The first candidate (in admission's order) a preemption would let in, and its victims.

    ``policies``: tenant → (reclaim, within-tenant). ``running``: every charged
    request that could be a victim, and those already stopping. None when
    nothing is to be preempted — including when work already stopping will make
    room for the first candidate that needs it. ``spared``: candidate → the
    request that preempted it (never its victim in turn). ``holders``: waiting
    preemptors whose room is held, oldest first; the room they will take once
    the stopping work is back is not offered to anyone else.
    """
    state = _State({name: dict(usage) for name, usage in tenants.items()},
                   {name: dict(usage) for name, usage in pools.items()}, sharing.copy())
    for work in running:
        if work.stopping:
            state.give_back(work)
    held = set()
    for holder in holders:
        if state.take_if_it_fits(holder):
            held.add(holder.id)
    victims = [work for work in running if not work.stopping]
    spared = spared or {}
    for candidate in candidates:
        if candidate.tenant not in policies or candidate.id in held:
            continue
        if state.admits(candidate):
            return None  # it fits, or will once the stopping work is back: wait
        reclaim, within = policies[candidate.tenant]
        priority = priorities[candidate.id]
        usage = state.tenants.get(candidate.tenant, {})
        if (reclaim != "never" and sharing.is_member(candidate.tenant)
                and _within_nominal(candidate, usage)):
            ordered = _victims_for(candidate, priority, "reclaim", reclaim, state, victims,
                                   spared.get(candidate.id))
            found = _choose(candidate, "reclaim", ordered, state)
            if found:
                return Preemption(candidate.id, found, "reclaim")
        if within != "never":
            ordered = _victims_for(candidate, priority, "within-tenant", within, state, victims,
                                   spared.get(candidate.id))
            found = _choose(candidate, "within-tenant", ordered, state)
            if found:
                return Preemption(candidate.id, found, "within-tenant")
    return None


class HeldRoom:
    """Admission's guard of held room (docs/decisions/721): a placement is allowed only
    if every waiting preemptor that would fit once the stopping work is back still
    fits with it. ``holders`` oldest hold first; ``stopping``: work being stopped."""

    def __init__(self, holders: Sequence[Candidate], stopping: Sequence[Running]) -> None:
        self.holders = tuple(holders)
        self.stopping = tuple(stopping)
        self.ids = frozenset(holder.id for holder in self.holders)

    def _fitting(self, state: _State, placed: set[str]) -> set[str]:
        for work in self.stopping:
            state.give_back(work)
        return {holder.id for holder in self.holders
                if holder.id not in placed and state.take_if_it_fits(holder)}

    def allows(
        self, candidate: Candidate, pool: str, tenants: Usage, pools: Usage,
        sharing: Sharing | None, placed: set[str],
    ) -> bool:
        """May ``candidate`` go into ``pool`` now, on the plan's usage so far?"""
        if candidate.id in self.ids:
            return True
        base = _State({name: dict(usage) for name, usage in tenants.items()},
                      {name: dict(usage) for name, usage in pools.items()},
                      sharing.copy() if sharing is not None else Sharing())
        trial = base.copy()
        trial.take(candidate, pool)
        # Only the holders that would fit without it must still fit with it: a hold
        # that cannot be honoured anyway (a cap lowered since) blocks nobody.
        return self._fitting(base, placed) <= self._fitting(trial, placed)
