"""Would a request be admitted now, and if not, why: the verdict of a dry run, pure.

``simulate`` and ``explain`` both ask it (docs/fair-sharing.md#dry-run). The
answer is that of the next admission pass: what admission's planner would place
before this request (fair share between tenants, queue order within each) is
placed first, on the same snapshot, then this one is judged on what is left. Each reason names a
code, the resource, what the request needs and what is available to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from quotagate.domain.budget import Budgets
from quotagate.domain.explanation import WaitingReason
from quotagate.domain.model import Cost
from quotagate.domain.placement import (
    Candidate,
    PlacementGuard,
    best_fit_pool,
    blocking_resources,
    charge,
    plan_admissions,
    remaining,
)
from quotagate.domain.sharing import Sharing

Usage = Mapping[str, tuple[int, int]]

# The codes of docs/fair-sharing.md.
BUDGET_EXHAUSTED = "budget_exhausted"
TENANT_QUOTA = "tenant_quota"
BORROWING_LIMIT = "borrowing_limit"
COHORT_CAPACITY = "cohort_capacity"
POOL_CAPACITY = "pool_capacity"
RATE_LIMITED = "rate_limited"
PRIORITY_ABOVE_MAX = "priority_above_max"
# Not in the list: the request fits, but admission reads only the
# first ``admission_window`` waiting requests of each tenant and this one is
# further back (docs/admission.md, "The window").
QUEUE_WINDOW = "queue_window"
# Not in the list either: it fits, but in room a preemption freed (or will
# free) for its preemptor, which admission holds for it (docs/decisions/721).
# ``resource`` "room", ``needed`` the preemptors it would keep out, ``available`` 0.
HELD_FOR_PREEMPTOR = "held_for_preemptor"


@dataclass(frozen=True)
class Reason:
    code: str
    resource: str
    needed: float
    available: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    admissible: bool
    reasons: list[Reason]
    # The tenant is a cohort member: its reasons are about limits and the cohort.
    member: bool = False
    # The tenant's own requests the next pass places before this one, in the order
    # it places them: best-effort order lets them take the room this one needs.
    ahead: tuple[str, ...] = ()
    # A member's (resource, needed, most it could ever hold) where its limits and its
    # cohort's shared room could never grant the cost (docs/decisions/824).
    never: tuple[tuple[str, int, int], ...] = ()


# Reasons about room, which what is placed first can take.
_ROOM = (BUDGET_EXHAUSTED, TENANT_QUOTA, BORROWING_LIMIT, COHORT_CAPACITY, POOL_CAPACITY,
         HELD_FOR_PREEMPTOR)


def describe_ahead(ahead: tuple[str, ...]) -> str:
    """``behind 2 earlier requests of its tenant (big, mid), …``: at most three ids."""
    shown = ", ".join(ahead[:3]) + (f", +{len(ahead) - 3} more" if len(ahead) > 3 else "")
    noun = "request" if len(ahead) == 1 else "requests"
    return (f"behind {len(ahead)} earlier {noun} of its tenant ({shown}), which the next "
            "admission pass admits first; then")


def describe_verdict(verdict: Verdict, admission_window: int) -> str:
    """One sentence for people (``explain``'s ``reason``)."""
    if verdict.admissible:
        return "fits now; it will be admitted by the next admission pass"
    parts = []
    for reason in verdict.reasons:
        if reason.code == QUEUE_WINDOW:
            parts.append(f"fits, but is number {reason.needed:g} in its tenant's queue; "
                         f"admission looks at the first {admission_window} of each tenant")
        elif reason.code == HELD_FOR_PREEMPTOR:
            parts.append("held_for_preemptor: fits, but only in room a preemption freed for a "
                         "waiting preemptor, held until it is admitted or its hold expires")
        else:
            parts.append(describe_reason(reason))
    sentence = "; ".join(parts)
    if verdict.never:
        # Accepted before a limit or the room was lowered under its cost (decision 809).
        held = ", ".join(f"{resource}={most}" for resource, _needed, most in verdict.never)
        sentence += (f"; its limits and its cohort's shared room allow at most {held}: it "
                     "cannot be admitted until they are raised")
    if verdict.ahead and any(reason.code in _ROOM for reason in verdict.reasons):
        return f"{describe_ahead(verdict.ahead)} {sentence}"
    return sentence


def waiting_reason(verdict: Verdict, plain: WaitingReason, admission_window: int) -> str:
    """``explain``'s sentence for a waiting request, and the dashboard's.

    ``plain`` (quotagate.domain.explanation.explain_waiting) judges the tenant's
    quota and the pools on today's usage; the verdict knows better for a cohort
    member (a nominal share: its limits and cohort decide), for a budget (not in
    the usage rows), for held room (not in the usage either: a guard), and when
    the plain sentence says it fits but what the next pass places first (its
    tenant's earlier requests, other tenants' heads) leaves no room for it.
    Where today's usage already refuses it, the plain sentence says more
    (what is used of what).
    """
    if verdict.member or any(entry.code in (BUDGET_EXHAUSTED, HELD_FOR_PREEMPTOR)
                             for entry in verdict.reasons):
        return describe_verdict(verdict, admission_window)
    if not verdict.admissible and fits_today(plain) and any(
            entry.code in _ROOM for entry in verdict.reasons):
        if verdict.ahead:
            return describe_verdict(verdict, admission_window)
        return ("fits today's usage, but the next admission pass places other tenants' "
                "requests first; then " + describe_verdict(verdict, admission_window))
    return plain.reason


def fits_today(plain: WaitingReason) -> bool:
    """The plain judgement: the tenant's quota and a pool have room on today's usage."""
    return not plain.tenant_blocked_by and bool(plain.fitting_pools)


def describe_reason(reason: Reason) -> str:
    """``pool_capacity: gpu needs 4, 2 available``; a budget's amounts are resource-hours."""
    unit = "h" if reason.code == BUDGET_EXHAUSTED else ""
    return (f"{reason.code}: {reason.resource} needs {reason.needed:g}{unit}, "
            f"{reason.available:g}{unit} available")


def _before(
    request: Candidate,
    queue: Iterable[Candidate],
    tenants: Mapping[str, Usage],
    pools: Mapping[str, Usage],
    sharing: Sharing,
    weights: Mapping[str, int] | None,
    budgets: Budgets,
    history: Mapping[str, float] | None = None,
    guard: PlacementGuard | None = None,
) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, dict[str, tuple[int, int]]], Sharing,
           tuple[str, ...]]:
    """The usage left when the request's turn comes, placing what comes before it
    exactly as admission's planner would (fair share between tenants with ``weights``),
    and the ids of its own tenant's requests placed; ``budgets`` is charged with what
    is placed."""
    tenant_usage = {name: dict(usage) for name, usage in tenants.items()}
    pool_usage = {name: dict(usage) for name, usage in pools.items()}
    left = sharing.copy()
    candidates = list(queue)
    ahead: list[str] = []
    for placement in plan_admissions(candidates, tenant_usage, pool_usage, len(candidates),
                                     left, weights, stop_before=request.id,
                                     budgets=budgets or None, history=history, guard=guard):
        budgets.charge(placement.tenant, placement.cost, placement.runtime)
        if left.is_member(placement.tenant):
            left.charge(placement.tenant, placement.cost, tenant_usage[placement.tenant])
        charge(tenant_usage[placement.tenant], placement.cost)
        charge(pool_usage[placement.pool], placement.cost)
        if placement.tenant == request.tenant:
            ahead.append(placement.id)
    return tenant_usage, pool_usage, left, tuple(ahead)


def tenant_reasons(tenant: str, cost: Cost, usage: Usage, sharing: Sharing) -> list[Reason]:
    """What the tenant side (quota, or for a member its limits and cohort) refuses."""
    if sharing.is_member(tenant):
        return [Reason(block.code, block.resource, block.needed, block.available)
                for block in sharing.blocking(tenant, cost, usage)]
    return [Reason(TENANT_QUOTA, resource, cost[resource], max(0, remaining(usage, resource)))
            for resource in blocking_resources(cost, usage)]


def pool_reasons(cost: Cost, pools: Mapping[str, Usage]) -> list[Reason]:
    """What the pools refuse: the resources lacking in the pool that comes closest."""
    if best_fit_pool(cost, pools) is not None:
        return []
    if not pools:
        return [Reason(POOL_CAPACITY, resource, amount, 0) for resource, amount in cost.items()]
    closest = min(sorted(pools), key=lambda name: len(blocking_resources(cost, pools[name])))
    return [Reason(POOL_CAPACITY, resource, cost[resource],
                   max(0, remaining(pools[closest], resource)))
            for resource in blocking_resources(cost, pools[closest])]


def judge(
    request: Candidate,
    *,
    queue: Iterable[Candidate],
    tenants: Mapping[str, Usage],
    pools: Mapping[str, Usage],
    sharing: Sharing,
    weights: Mapping[str, int] | None = None,
    tenant_position: int,
    admission_window: int,
    rate_tokens: float | None = None,
    max_priority: tuple[int, int] | None = None,
    budgets: Budgets | None = None,
    history: Mapping[str, float] | None = None,
    guard: PlacementGuard | None = None,
) -> Verdict:
    """The verdict for ``request``, a candidate among ``queue`` (heads in queue order).

    ``rate_tokens``: the tokens left in the tenant's bucket, for a request not
    submitted yet (None: no bucket, or the request has passed the gate already).
    ``max_priority``: (the request's priority, the tenant's maximum) when above it.
    ``budgets``: the snapshot's budgets; a request whose reservation does not fit
    what its budget has left is ``budget_exhausted`` (needed, available:
    resource-hours). ``history``: tenants' decayed past shares (a half-life).
    ``guard``: admission's guard of held room, if a preemptor's room is held.
    """
    reasons: list[Reason] = []
    if max_priority is not None:
        reasons.append(Reason(PRIORITY_ABOVE_MAX, "priority", *max_priority))
    if rate_tokens is not None and rate_tokens < 1:
        reasons.append(Reason(RATE_LIMITED, "tokens", 1, round(max(rate_tokens, 0.0), 3)))
    budgets_left = budgets.copy() if budgets else Budgets()
    tenant_usage, pool_usage, left, ahead = _before(request, queue, tenants, pools, sharing,
                                                    weights, budgets_left, history, guard)
    # Budgets in resource-hours, as they are set (gpu=100h/30d).
    reasons += [Reason(BUDGET_EXHAUSTED, block.resource, round(block.needed / 3600, 3),
                       round(block.available / 3600, 3))
                for block in budgets_left.blocking(request.tenant, request.cost,
                                                   request.runtime)]
    reasons += tenant_reasons(request.tenant, request.cost, tenant_usage.get(request.tenant, {}),
                              left)
    reasons += pool_reasons(request.cost, pool_usage)
    pool = best_fit_pool(request.cost, pool_usage)
    if not reasons and guard is not None and pool is not None and not guard.allows(
        request, pool, tenant_usage, pool_usage, left, set()
    ):
        reasons.append(Reason(HELD_FOR_PREEMPTOR, "room", 1, 0))
    if not reasons and tenant_position > admission_window:
        reasons.append(Reason(QUEUE_WINDOW, "queue", tenant_position, admission_window))
    member = sharing.is_member(request.tenant)
    never = tuple((resource, amount, most) for resource, amount in sorted(request.cost.items())
                  if member and amount > (most := sharing.most_ever(request.tenant, resource)))
    return Verdict(not reasons, reasons, member, ahead, never)
