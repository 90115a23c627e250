"""What makes a submission acceptable, judged on the facts one query reads.

Shared by submit (quotagate.store.ledger) and the dry run (quotagate.store.views),
so that a dry run refuses exactly what submit would refuse, with the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping

from quotagate.domain.model import Submission
from quotagate.domain.placement import fits_when_empty
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
            f"priority {submission.priority} is above tenant {quoted(submission.tenant)}'s maximum "
            f"{next(iter(maximum))}; nothing was submitted",
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
    A cohort member free to borrow as far as its cohort has room is not judged here: that
    room changes with every member's quota.
    """
    ceilings: dict[str, tuple[int | None, int]] = {}
    for value in facts.get("ceiling", ()):
        resource, amount, nominal = value.split(":")
        ceilings[resource] = (int(amount) if amount else None, int(nominal))
    for resource, needed in sorted(submission.cost.items()):
        ceiling, cap = ceilings.get(resource, (0, 0))  # no quota for it: a cap of zero
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
