"""What makes a submission acceptable, judged on the facts one query reads.

Shared by submit (quotagate.store.ledger) and the dry run (quotagate.store.views),
so that a dry run refuses exactly what submit would refuse, with the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quotagate.domain.model import Submission
from quotagate.domain.placement import fits_when_empty
from quotagate.domain.sharing import MemberLimits
from quotagate.errors import InvalidInput, NotFound, quoted


def require_submittable(
    submission: Submission, facts: Mapping[str, set[str]], *, check_priority: bool = True
) -> None:
    """Raise what submit raises for an unknown tenant, resource or target, or a priority
    above the tenant's maximum (the dry run reports that one as a reason instead).

    ``facts`` are the rows of :func:`quotagate.store.statements.submission_facts_query`.
    """
    if "tenant" not in facts:
        raise NotFound(
            f"tenant {quoted(submission.tenant)} does not exist; create it with "
            "'quotagate tenant set'",
            code="unknown_tenant",
        )
    pools = _pool_capacities(facts)
    offered = {resource for capacity in pools.values() for resource in capacity}
    unknown = sorted(set(submission.cost) - offered)
    if unknown:
        raise InvalidInput(
            f"unknown resource {', '.join(map(repr, unknown))}: no pool offers it",
            code="unknown_resource",
        )
    _require_within_ceilings(submission, facts, pools)
    if submission.target is not None and "target" not in facts:
        raise NotFound(f"target {quoted(submission.target)} does not exist", code="unknown_target")
    if "default_closed" in facts:
        raise NotFound(
            "the request names no target and the default target does not serve tenant "
            f"{quoted(submission.tenant)}; name a target",
            code="no_default_target",
        )
    maximum = facts.get("max_priority")
    if check_priority and maximum and submission.priority > int(next(iter(maximum))):
        raise InvalidInput(
            # Not "tenant 'team-a''s maximum": a possessive after a quoted name reads as a typo.
            f"priority {submission.priority} is above the maximum {next(iter(maximum))} of "
            f"tenant {quoted(submission.tenant)}; nothing was submitted",
            code="priority_above_max",
        )


def _pool_capacities(facts: Mapping[str, set[str]]) -> dict[str, dict[str, int]]:
    """Each pool's capacity per cost resource it offers, from the ``pool_cap`` facts."""
    pools: dict[str, dict[str, int]] = {}
    for value in facts.get("pool_cap", ()):
        pool, resource, capacity = value.split(":")
        pools.setdefault(pool, {})[resource] = int(capacity)
    return pools


def _require_within_ceilings(
    submission: Submission, facts: Mapping[str, set[str]], pools: Mapping[str, Mapping[str, int]]
) -> None:
    """Refuse a cost no admission could ever grant as the ledger stands: more than the
    tenant could ever hold, or more than any one pool holds (docs/decisions/809).

    Such a request would wait until it expired, ``explain`` saying only that it did not fit.
    A cohort member is bounded by its nominal plus its borrowing limit, and by its
    guaranteed part plus its cohort's whole shared room, as the ledger stands
    (docs/decisions/824), as a pool is by its capacity.
    """
    ceilings = {ceiling.resource: ceiling for ceiling in map(_Ceiling.parse, facts.get("ceiling", ()))}
    for resource, needed in sorted(submission.cost.items()):
        # No quota for it: a cap of zero.
        entry = ceilings.get(resource) or _Ceiling(resource, 0, 0, None, None, None)
        ceiling, cap = entry.ceiling, entry.nominal
        room = entry.room()
        if room is not None and needed > (most := room.guaranteed + room.cap) and (
                ceiling is None or most < ceiling):
            # A member holds beyond its guaranteed part only what its cohort's shared room
            # holds (docs/decisions/824): with a room smaller than its borrowing limit
            # allows, "its quota allows gpu=6" would name a limit it can never reach.
            raise InvalidInput(
                f"cost {resource}={needed} is more than tenant {quoted(submission.tenant)} can "
                f"ever hold: its guaranteed {resource}={room.guaranteed} plus the shared room "
                f"of cohort {quoted(room.cohort)} (cap {resource}={room.cap}) allow "
                f"{resource}={most}; nothing was submitted",
                code="cost_above_cohort_room", resource=resource, needed=needed, limit=most,
                cohort=room.cohort,
            )
        if ceiling is not None and needed > ceiling:
            # A member's ceiling is its nominal quota plus its borrowing limit: "its quota
            # allows gpu=6" named neither, and its quota is 4.
            allows = (f"its quota allows {resource}={ceiling}" if ceiling == cap else
                      f"its nominal quota {resource}={cap} plus its borrowing limit "
                      f"{resource}={ceiling - cap} allow {resource}={ceiling}")
            raise InvalidInput(
                f"cost {resource}={needed} is more than tenant {quoted(submission.tenant)} can "
                f"ever hold: {allows}; nothing was submitted",
                code="cost_above_quota", resource=resource, needed=needed, limit=ceiling,
            )
    if any(fits_when_empty(submission.cost, capacity) for capacity in pools.values()):
        return
    for resource, needed in sorted(submission.cost.items()):
        largest = max((capacity.get(resource, 0) for capacity in pools.values()), default=0)
        if needed > largest:
            raise InvalidInput(
                f"cost {resource}={needed} is more than any pool holds: the largest has "
                f"{resource}={largest}; nothing was submitted",
                code="cost_above_capacity", resource=resource, needed=needed, limit=largest,
            )
    wanted = ", ".join(f"{resource}={needed}" for resource, needed in sorted(submission.cost.items()))
    raise InvalidInput(
        f"no pool holds {wanted} at once: each lacks one of them; nothing was submitted",
        code="cost_above_capacity",
    )


@dataclass(frozen=True)
class _Ceiling:
    """One ``ceiling`` fact: a tenant's quota row for a cost resource, and its room."""

    resource: str
    ceiling: int | None  # nominal + borrowing limit; None: a member bounded by its room only
    nominal: int
    lending_limit: int | None
    room_cap: int | None  # its root cohort's shared room (None: not a member)
    root: str | None

    @classmethod
    def parse(cls, value: str) -> _Ceiling:
        resource, amount, nominal, lending, room, root = value.split(":")
        return cls(resource, int(amount) if amount else None, int(nominal),
                   int(lending) if lending else None, int(room) if room else None,
                   root or None)

    def room(self) -> _Room | None:
        """A member's own part and its root cohort's shared room (None: not a member)."""
        if self.room_cap is None or self.root is None:
            return None
        limits = MemberLimits(nominal=self.nominal, lending_limit=self.lending_limit)
        return _Room(self.root, self.room_cap, limits.guaranteed)


@dataclass(frozen=True)
class _Room:
    cohort: str
    cap: int
    guaranteed: int  # the member's nominal less what it lends: its own, outside the room
