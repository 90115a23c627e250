"""Cohorts: tenants lending each other unused nominal quota (docs/fair-sharing.md).

A tenant in a cohort tree keeps ``guaranteed = nominal - lendable`` for itself
alone; the rest of its nominal (``lendable``: its lending limit, or all of its
nominal without one) goes into the tree's shared room. Whatever a member uses
above its own guaranteed part is drawn from that shared room, so per root cohort
and resource::

    shared used = sum over members of max(0, used - guaranteed)  <=  sum of lendable

That one inequality is what admission charges (a counter row per root cohort and
resource, charged by a conditional UPDATE) and it implies the invariants of the
issue: the members together never use more than their summed nominal, and the
borrowers' excess never exceeds what the others have unused and lendable, so an
attribution of lending exists in which no tenant lends more than its lending
limit (:func:`attribute_lending`). Each member is also capped at
``nominal + borrowing limit`` (no borrowing limit: bounded by the cohort only).

The whole tree is one sharing domain: a sub-cohort groups tenants (for
reporting, and for cohort-level limits later), it does not fence its room off
from its siblings (docs/decisions/701-one-sharing-domain-per-cohort-tree.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quotagate.domain.model import Cost

# The ceiling of a member without a borrowing limit: far above any real cap
# (amounts are at most 10**12), small enough for every engine's BIGINT.
UNBOUNDED = 2**62


@dataclass(frozen=True, slots=True)
class MemberLimits:
    """One member's limits for one resource, with what follows from them computed once
    (admission asks for them for every candidate)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    # The part of its nominal this member puts into the shared room.
    lendable: int = field(init=False)
    # The part of its nominal only this member may use.
    guaranteed: int = field(init=False)
    # The most this member may use: nominal plus borrowing limit.
    ceiling: int = field(init=False)

    def __post_init__(self) -> None:
        lendable = (self.nominal if self.lending_limit is None
                    else max(0, min(self.lending_limit, self.nominal)))
        object.__setattr__(self, "lendable", lendable)
        object.__setattr__(self, "guaranteed", self.nominal - lendable)
        object.__setattr__(self, "ceiling", UNBOUNDED if self.borrowing_limit is None
                           else self.nominal + self.borrowing_limit)

    def shared_use(self, used: int) -> int:
        """How much of the shared room a use of ``used`` occupies."""
        return used - self.guaranteed if used > self.guaranteed else 0


def shared_delta(limits: MemberLimits, used: int, amount: int) -> int:
    """The change of the shared room's use when ``used`` changes by ``amount`` (± )."""
    return limits.shared_use(used + amount) - limits.shared_use(used)


def root_of(cohort: str, parents: Mapping[str, str | None]) -> str:
    """The root of ``cohort``'s tree. A cycle cannot be stored (cohort set refuses it);
    should one appear anyway, the walk stops where it would loop."""
    seen = {cohort}
    current = cohort
    while (parent := parents.get(current)) is not None and parent not in seen:
        seen.add(parent)
        current = parent
    return current


def would_cycle(cohort: str, parent: str, parents: Mapping[str, str | None]) -> bool:
    """True when making ``parent`` the parent of ``cohort`` would close a loop."""
    current: str | None = parent
    seen: set[str] = set()
    while current is not None and current not in seen:
        if current == cohort:
            return True
        seen.add(current)
        current = parents.get(current)
    return False


@dataclass(frozen=True)
class Member:
    """A tenant's standing in its cohort for one resource."""

    tenant: str
    used: int
    limits: MemberLimits

    @property
    def borrowed(self) -> int:
        return max(0, self.used - self.limits.nominal)

    @property
    def unused_lendable(self) -> int:
        """What this member could lend right now: lendable and not used by itself."""
        return max(0, min(self.limits.lendable, self.limits.nominal - self.used))


def cohort_totals(members: Iterable[Member]) -> tuple[int, int]:
    """``(shared used, shared cap)`` of one root cohort and resource, from its members."""
    used = cap = 0
    for member in members:
        used += member.limits.shared_use(member.used)
        cap += member.limits.lendable
    return used, cap


def attribute_lending(members: Iterable[Member]) -> dict[str, int]:
    """Who lends what the borrowers of one root cohort and resource use.

    The borrowed total is spread over the members with unused lendable room in
    proportion to that room (remainders to the largest fractions, then by name),
    so nobody is shown lending more than it has unused and lendable — which is
    never more than its lending limit. If the borrowed total exceeds all
    lendable room (a broken invariant, which ``check`` reports), every lender is
    shown lending all of its room.
    """
    members = list(members)
    borrowed = sum(member.borrowed for member in members)
    room = {member.tenant: member.unused_lendable for member in members}
    total_room = sum(room.values())
    if borrowed == 0 or total_room == 0:
        return {member.tenant: 0 for member in members}
    if borrowed >= total_room:
        return room
    shares = {tenant: borrowed * amount // total_room for tenant, amount in room.items()}
    left = borrowed - sum(shares.values())
    by_fraction = sorted(
        room, key=lambda tenant: (-(borrowed * room[tenant] % total_room), tenant)
    )
    for tenant in by_fraction[:left]:
        shares[tenant] += 1
    return shares


Usage = Mapping[str, tuple[int, int]]


@dataclass
class Sharing:
    """The cohort side of one admission snapshot.

    ``roots``: tenant → root cohort, for members only; ``limits``: (tenant,
    resource) → limits; ``cohorts``: root → resource → (shared used, shared cap).
    :meth:`fits` and :meth:`charge` are what placement asks of a member instead
    of the plain ``used + cost <= cap``.
    """

    roots: dict[str, str] = field(default_factory=dict)
    limits: dict[tuple[str, str], MemberLimits] = field(default_factory=dict)
    cohorts: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.roots)

    def copy(self) -> Sharing:
        return Sharing(dict(self.roots), dict(self.limits),
                       {root: dict(room) for root, room in self.cohorts.items()})

    def is_member(self, tenant: str) -> bool:
        return tenant in self.roots

    def blocking(self, tenant: str, cost: Cost, usage: Usage) -> list[BorrowingBlock]:
        """Why ``cost`` does not fit a member now (empty: it fits)."""
        root = self.roots[tenant]
        room = self.cohorts.get(root, {})
        blocks: list[BorrowingBlock] = []
        for resource, amount in cost.items():
            limits = self.limits.get((tenant, resource))
            used = usage.get(resource, (0, 0))[0]
            if limits is None:
                blocks.append(BorrowingBlock("tenant_quota", resource, amount, 0))
                continue
            if used + amount > limits.ceiling:
                code = "borrowing_limit" if used + amount > limits.nominal else "tenant_quota"
                blocks.append(BorrowingBlock(code, resource, amount,
                                             max(0, limits.ceiling - used)))
                continue
            delta = shared_delta(limits, used, amount)
            shared_used, shared_cap = room.get(resource, (0, 0))
            if delta > 0 and shared_used + delta > shared_cap:
                own = max(0, limits.guaranteed - used)
                blocks.append(BorrowingBlock("cohort_capacity", resource, amount,
                                             own + max(0, shared_cap - shared_used)))
        return blocks

    def fits(self, tenant: str, cost: Cost, usage: Usage) -> bool:
        return not self.blocking(tenant, cost, usage)

    def most_ever(self, tenant: str, resource: str) -> int:
        """The most of ``resource`` a member could hold with nothing else used: its
        ceiling, and its guaranteed part plus its root cohort's whole shared room."""
        limits = self.limits.get((tenant, resource))
        if limits is None:
            return 0
        _used, room_cap = self.cohorts.get(self.roots[tenant], {}).get(resource, (0, 0))
        return min(limits.ceiling, limits.guaranteed + room_cap)

    def charge(self, tenant: str, cost: Cost, usage: Usage) -> None:
        """Charge the cohort room for ``cost`` on top of ``usage`` (charge the tenant after)."""
        room = self.cohorts.setdefault(self.roots[tenant], {})
        for resource, amount in cost.items():
            delta = shared_delta(self.limits[tenant, resource], usage.get(resource, (0, 0))[0],
                                 amount)
            shared_used, shared_cap = room.get(resource, (0, 0))
            room[resource] = (shared_used + delta, shared_cap)

    def open(self, tenant: str, usage: Usage) -> bool:
        """Whether a member could take one more unit of anything (a cheap pre-filter)."""
        return any(
            used < limits.ceiling
            for resource, (used, _cap) in usage.items()
            if (limits := self.limits.get((tenant, resource))) is not None
        )


@dataclass(frozen=True)
class BorrowingBlock:
    """One reason a member's request does not fit: a code of docs/fair-sharing.md."""

    code: str
    resource: str
    needed: int
    available: int


class Keep:
    """The value of a setting a change leaves as it is."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


@dataclass(frozen=True)
class TenantSharing:
    """A change of a tenant's sharing settings (cohort, limits, weight, maximum
    priority); what it does not name stays as it is.

    ``cohort``: a cohort name, None to leave the cohort, or KEEP. Limits map a
    resource to an amount, or to None to remove that limit.
    """

    cohort: str | Keep | None = KEEP
    borrowing_limit: Mapping[str, int | None] = field(default_factory=dict)
    lending_limit: Mapping[str, int | None] = field(default_factory=dict)
    weight: int | None = None
    # The highest priority its requests may ask for; None removes the cap.
    max_priority: int | Keep | None = KEEP
    # Preemption policies; None: unchanged.
    reclaim: str | None = None
    within_tenant: str | None = None
    # What a confirmed preemption does to its victims (fail | requeue); None: unchanged.
    on_preempt: str | None = None

    def __bool__(self) -> bool:
        return (self.cohort is not KEEP or bool(self.borrowing_limit)
                or bool(self.lending_limit) or self.weight is not None
                or self.max_priority is not KEEP or self.reclaim is not None
                or self.within_tenant is not None or self.on_preempt is not None)

    def describe(self) -> str:
        """The change, for the audit log."""
        parts: list[str] = []
        if self.cohort is not KEEP:
            parts.append(f"cohort={self.cohort or 'none'}")
        for name, limits in (("borrowing_limit", self.borrowing_limit),
                             ("lending_limit", self.lending_limit)):
            parts += [f"{name}.{resource}={'none' if amount is None else amount}"
                      for resource, amount in sorted(limits.items())]
        if self.weight is not None:
            parts.append(f"weight={self.weight}")
        for name, policy in (("reclaim", self.reclaim), ("within_tenant", self.within_tenant),
                             ("on_preempt", self.on_preempt)):
            if policy is not None:
                parts.append(f"{name}={policy}")
        if self.max_priority is not KEEP:
            parts.append(f"max_priority={'none' if self.max_priority is None else self.max_priority}")
        return ",".join(parts)


def standings(
    tenants: Mapping[str, Usage], sharing: Sharing
) -> dict[tuple[str, str], tuple[int, int]]:
    """``{(member, resource): (borrowed, lent)}`` from one snapshot's use and limits.

    What ``inspect`` and ``GET /v1/usage`` show (attributed by
    :func:`attribute_lending` within each root cohort and resource), computed
    from rows already read instead of reading the members again.
    """
    trees: dict[tuple[str, str], list[Member]] = {}
    for (tenant, resource), limits in sorted(sharing.limits.items()):
        root = sharing.roots.get(tenant)
        if root is None:
            continue
        used = tenants.get(tenant, {}).get(resource, (0, 0))[0]
        trees.setdefault((root, resource), []).append(Member(tenant, used, limits))
    result: dict[tuple[str, str], tuple[int, int]] = {}
    for (_root, resource), members in trees.items():
        lent = attribute_lending(members)
        for member in members:
            result[member.tenant, resource] = (member.borrowed, lent[member.tenant])
    return result
