"""Read-only views: show, inspect, explain, usage and the invariant check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.dry_run import Verdict, judge, waiting_reason
from quotagate.domain.explanation import explain_waiting
from quotagate.domain.model import (
    CHARGED_STATES,
    STOPPING_STATES,
    Request,
    RequestState,
    Submission,
)
from quotagate.domain.ordering import effective_priority, queue_key
from quotagate.domain.placement import Candidate, total_cost
from quotagate.domain.preemption import choose_preemption
from quotagate.errors import Conflict, quoted
from quotagate.store import (
    budget_views,
    budgets,
    cohorts,
    fair_history,
    holds,
    pool_slices,
    schema,
    statements,
)
from quotagate.store.dialect import reading
from quotagate.store.preemption import running_work
from quotagate.store.rows import all_usage, decode_cost, request_from_row, visible_request_row
from quotagate.store.submission import reserved_runtime
from quotagate.store.submission_facts import require_submittable

# What ``explain`` says a stopping request is waiting on the stop for.
_STOP_CAUSES = {
    RequestState.CANCELLING: "cancelled",
    RequestState.COMPLETING: "completed by an admin",
    RequestState.FAILING: "failed by an admin",
    RequestState.PREEMPTING: "preempted",
    RequestState.TIMING_OUT: "past its max-runtime",
}


@dataclass(frozen=True)
class LedgerCheck:
    """What ``quotagate check`` found: broken invariants, and usage above a cap."""

    violations: list[str]
    over_cap: list[str]


class Explanation(TypedDict):
    """Why a request is or is not admitted yet (``quotagate explain``, ``GET …/requests/{id}``).

    Every explanation has the first four keys; a waiting request has its place
    in the queue and what blocks it; a cancelled request still charged has its
    stop attempts (and, for an operator, the target's last answer).
    """

    id: str
    state: str
    waiting: bool
    reason: str
    position: NotRequired[int]
    tenant_position: NotRequired[int]
    effective_priority: NotRequired[float]
    waited_seconds: NotRequired[float]
    tenant_blocked_by: NotRequired[list[dict[str, int | str]]]
    pools_blocked: NotRequired[dict[str, list[str]]]
    fitting_pools: NotRequired[list[str]]
    stop_attempts: NotRequired[int]
    last_answer: NotRequired[str | None]
    # The dry run's verdict on the same snapshot (docs/fair-sharing.md#dry-run).
    admissible: NotRequired[bool]
    reasons: NotRequired[list[dict[str, Any]]]


class TenantUsage(TypedDict):
    """A tenant's use of one resource; with cohorts its quota is a nominal share."""

    tenant: str
    resource: str
    used: int
    cap: int
    nominal: int
    cohort: str | None
    borrowed: int
    lent: int


class CohortRoom(TypedDict):
    """The shared room of a root cohort for one resource."""

    cohort: str
    resource: str
    used: int
    cap: int


class PoolUsage(TypedDict):
    pool: str
    resource: str
    used: int
    cap: int


class Usage(TypedDict):
    """Used and cap of every tenant's and every pool's resources."""

    tenants: list[TenantUsage]
    pools: list[PoolUsage]
    cohorts: list[CohortRoom]
    # Per budgeted tenant and resource: spent, reserved ahead, left, frees_at (store.budgets).
    budgets: NotRequired[list[dict[str, Any]]]


class InspectedRequest(TypedDict):
    """One recent request with its outbox row and binding (``quotagate inspect``)."""

    id: str
    tenant: str
    cost: dict[str, int]
    state: str
    pool: str | None
    priority: int
    created: float
    outbox: str | None  # pending, delivered, stopping; None before admission
    attempts: int | None
    last_error: str | None
    stop_progress: str | None  # a stop's answer while under way (docs/decisions/823)
    binding: str | None
    uid: str | None


class Inspection(Usage):
    requests: list[InspectedRequest]


def _usage_view(connection: sa.Connection) -> Usage:
    """Used and cap per tenant and pool resource; per tenant also nominal, borrowed, lent."""
    tenants, pools = all_usage(connection)
    standing = cohorts.standing(connection)

    def tenant_usage(name: str, resource: str, used: int, cap: int) -> TenantUsage:
        entry = standing.get((name, resource))
        return TenantUsage(
            tenant=name, resource=resource, used=used, cap=cap, nominal=cap,
            cohort=None if entry is None else entry.cohort,
            borrowed=0 if entry is None else entry.borrowed,
            lent=0 if entry is None else entry.lent,
        )

    return Usage(
        tenants=[tenant_usage(name, resource, used, cap)
                 for name, resources in sorted(tenants.items())
                 for resource, (used, cap) in sorted(resources.items())],
        pools=[PoolUsage(pool=name, resource=resource, used=used, cap=cap)
               for name, resources in sorted(pools.items())
               for resource, (used, cap) in sorted(resources.items())],
        cohorts=[CohortRoom(cohort=root, resource=resource, used=used, cap=cap)
                 for root, room in sorted(cohorts.rooms(connection).items())
                 for resource, (used, cap) in sorted(room.items())],
    )


class LedgerViews:
    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock | None = None,
        aging_interval: float = 30.0,
        admission_window: int = 32,
    ) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        self.aging_interval = aging_interval
        self.admission_window = admission_window

    def show(self, request_id: str, *, tenant: str | None = None) -> Request:
        with reading(self.engine) as connection:
            row = visible_request_row(connection, request_id, tenant)
        return request_from_row(row)

    def usage(self) -> Usage:
        with reading(self.engine) as connection:
            usage = _usage_view(connection)
            usage["budgets"] = budget_views.describe_all(connection, self.clock.now())
            return usage

    def inspect(self, limit: int = 20) -> Inspection:
        """The troubleshooting query: recent requests with their outbox row and binding."""
        request, outbox, binding = schema.request, schema.outbox, schema.binding
        query = (
            sa.select(
                request.c.id, request.c.tenant, request.c.cost, request.c.state, request.c.pool,
                request.c.priority, request.c.created,
                outbox.c.delivered, outbox.c.stopping, outbox.c.attempts, outbox.c.last_error,
                outbox.c.stop_progress, binding.c.external_name, binding.c.uid,
            )
            .select_from(
                request.outerjoin(outbox, outbox.c.request_id == request.c.id).outerjoin(
                    binding, binding.c.request_id == request.c.id
                )
            )
            .order_by(request.c.created.desc(), request.c.id.desc())
            .limit(limit)
        )
        with reading(self.engine) as connection:
            requests = [
                InspectedRequest(
                    id=row.id,
                    tenant=row.tenant,
                    cost=decode_cost(row.cost),
                    state=row.state,
                    pool=row.pool,
                    priority=row.priority,
                    created=row.created,
                    outbox=None if row.delivered is None else (
                        "stopping" if row.stopping else
                        "delivered" if row.delivered else "pending"
                    ),
                    attempts=row.attempts,
                    last_error=row.last_error,
                    stop_progress=row.stop_progress,
                    binding=row.external_name,
                    uid=row.uid,
                )
                for row in connection.execute(query)
            ]
            usage = _usage_view(connection)
        return Inspection(tenants=usage["tenants"], pools=usage["pools"],
                          cohorts=usage["cohorts"], requests=requests)

    def queue_position(self, connection: sa.Connection, row: Any, *, same_tenant: bool) -> int:
        """1-based place in the waiting queue (of everyone, or of the request's tenant)."""
        request = schema.request
        ahead = sa.or_(
            request.c.queue_key < row["queue_key"],
            sa.and_(
                request.c.queue_key == row["queue_key"],
                sa.or_(
                    request.c.created < row["created"],
                    sa.and_(request.c.created == row["created"], request.c.id < row["id"]),
                ),
            ),
        )
        query = sa.select(sa.func.count()).where(
            request.c.state == RequestState.WAITING.value, ahead
        )
        if same_tenant:
            query = query.where(request.c.tenant == row["tenant"])
        return int(connection.execute(query).scalar_one()) + 1

    @staticmethod
    def _explain_stop(connection: sa.Connection, row: Any, *, admin: bool) -> Explanation:
        """A stopping request still charged: its stop awaits the target's confirmation."""
        stop = connection.execute(
            sa.select(schema.outbox.c.attempts, schema.outbox.c.last_error,
                      schema.outbox.c.stop_progress)
            .where(schema.outbox.c.request_id == row["id"])
        ).first()
        attempts = 0 if stop is None else int(stop.attempts)
        explained = Explanation(
            id=row["id"], state=row["state"], waiting=False, stop_attempts=attempts,
            reason=f"{_STOP_CAUSES[RequestState(row['state'])]}; still charged until its target "
                   f"confirms the work stopped ({attempts} unconfirmed stop attempts so far)",
        )
        if admin and stop is not None:
            # The target's own answer is for operators (docs/decisions/214): its failure
            # if the last attempt failed, else the stop's progress (docs/decisions/823).
            explained["last_answer"] = stop.last_error or stop.stop_progress
        return explained

    def explain(self, request_id: str, *, tenant: str | None = None) -> Explanation:
        """Why a waiting request is not admitted yet."""
        with reading(self.engine) as connection:
            row = visible_request_row(connection, request_id, tenant)
            if RequestState(row["state"]) in STOPPING_STATES:
                return self._explain_stop(connection, row, admin=tenant is None)
            if row["state"] != RequestState.WAITING.value:
                return Explanation(id=request_id, state=row["state"], waiting=False,
                                   reason=f"request is {row['state']}, not waiting")
            cost = decode_cost(row["cost"])
            tenants, pools = all_usage(connection)
            position = self.queue_position(connection, row, same_tenant=False)
            tenant_position = self.queue_position(connection, row, same_tenant=True)
            verdict = self._verdict(connection, Candidate(row["id"], row["tenant"], cost,
                                                          row["reserved_runtime"]),
                                    (row["queue_key"], row["created"], row["id"]),
                                    tenant_position, rate_tokens=None)
        why = explain_waiting(cost, tenants.get(row["tenant"], {}), pools, tenant_position,
                              self.admission_window)
        reason = waiting_reason(verdict, why, self.admission_window)
        now = self.clock.now()
        return Explanation(
            id=request_id,
            state=row["state"],
            waiting=True,
            position=position,
            tenant_position=tenant_position,
            effective_priority=round(
                effective_priority(row["priority"], row["created"], now, self.aging_interval), 3
            ),
            waited_seconds=round(max(0.0, now - row["created"]), 3),
            tenant_blocked_by=why.tenant_blocked_by,
            pools_blocked=why.pools_blocked,
            fitting_pools=why.fitting_pools,
            reason=reason,
            # The dry run's verdict on the same snapshot (docs/fair-sharing.md#dry-run).
            admissible=verdict.admissible,
            reasons=[entry.to_dict() for entry in verdict.reasons],
        )

    def _verdict(
        self, connection: sa.Connection, request: Candidate,
        key: tuple[float, float, str], tenant_position: int, *, rate_tokens: float | None,
        max_priority: tuple[int, int] | None = None,
    ) -> Verdict:
        """Judge ``request`` (at queue place ``key``) on one snapshot, behind whatever the
        next admission pass would place before it (quotagate.domain.dry_run)."""
        snapshot = cohorts.snapshot_from_rows(
            connection.execute(statements.admission_snapshot_query()))
        if snapshot.budgeted:
            snapshot.budgets = budgets.read_budgets(connection, self.clock.now())
        names = sorted(snapshot.tenants)
        heads: list[tuple[tuple[float, float, str], Candidate]] = [(key, request)]
        if names:
            heads += [
                ((head.queue_key, head.created, head.id),
                 Candidate(head.id, head.tenant, decode_cost(head.cost), head.reserved_runtime))
                for head in connection.execute(
                    statements.head_query(len(names), self.admission_window),
                    statements.head_parameters(names))
                if head.id != request.id
            ]
        heads.sort(key=lambda entry: entry[0])
        return judge(request, queue=[candidate for _key, candidate in heads],
                     tenants=snapshot.tenants, pools=snapshot.pools, sharing=snapshot.sharing,
                     weights=snapshot.weights, tenant_position=tenant_position,
                     admission_window=self.admission_window, rate_tokens=rate_tokens,
                     max_priority=max_priority, budgets=snapshot.budgets,
                     history=fair_history.history(snapshot, self.clock.now()),
                     guard=holds.read_guard(connection, self.clock.now())
                     if snapshot.holds else None)

    def simulate(
        self, submission: Submission, *, rate_tokens: float | None = None,
        named: bool = True,
    ) -> dict[str, Any]:
        """What submitting ``submission`` now would lead to, writing nothing.

        Validated as submit validates (tenant, resources, target); a ``named``
        id that exists already is refused, since a dry run judges new requests
        only. ``rate_tokens``: the tokens left in the tenant's bucket (None: no
        bucket). Only reads, in one read transaction.
        """
        now = self.clock.now()
        with reading(self.engine) as connection:
            facts: dict[str, set[str]] = {}
            for fact, value in connection.execute(
                statements.submission_facts_query(submission.target is not None),
                {"id": submission.id, "tenant": submission.tenant,
                 "resources": list(submission.cost), "target": submission.target},
            ):
                facts.setdefault(fact, set()).add(value)
            require_submittable(submission, facts, check_priority=False)
            if named and "request" in facts:
                raise Conflict(
                    f"request {quoted(submission.id)} exists already; a dry run judges a new "
                    "request ('quotagate explain' says why a waiting one waits)",
                    code="request_exists")
            key = queue_key(submission.priority, now, self.aging_interval)
            row = {"id": submission.id, "tenant": submission.tenant, "created": now,
                   "queue_key": key}
            position = self.queue_position(connection, row, same_tenant=False)
            tenant_position = self.queue_position(connection, row, same_tenant=True)
            maximum = facts.get("max_priority")
            above = None
            if maximum and submission.priority > int(next(iter(maximum))):
                above = (submission.priority, int(next(iter(maximum))))
            verdict = self._verdict(connection,
                                    Candidate(submission.id, submission.tenant,
                                              dict(submission.cost),
                                              reserved_runtime(submission, facts)),
                                    (key, now, submission.id), tenant_position,
                                    rate_tokens=rate_tokens, max_priority=above)
            would_preempt = [] if verdict.admissible else self._would_preempt(
                connection, Candidate(submission.id, submission.tenant, dict(submission.cost)),
                submission.priority, now)
        return {
            "admissible": verdict.admissible,
            "position": position,
            "tenant_position": tenant_position,
            "reasons": [reason.to_dict() for reason in verdict.reasons],
            "would_preempt": would_preempt,
        }

    @staticmethod
    def _would_preempt(
        connection: sa.Connection, request: Candidate, priority: int, now: float
    ) -> list[dict[str, Any]]:
        """The victims a preemption would stop for ``request`` if it waited now."""
        snapshot = cohorts.snapshot_from_rows(
            connection.execute(statements.admission_snapshot_query()))
        if request.tenant not in snapshot.policies:
            return []
        chosen = choose_preemption(
            [request], {request.id: priority}, tenants=snapshot.tenants, pools=snapshot.pools,
            sharing=snapshot.sharing, policies=snapshot.policies,
            running=running_work(connection, {request.tenant}),
            holders=holds.holders(connection, now) if snapshot.holds else ())
        if chosen is None:
            return []
        return [{"id": victim.id, "tenant": victim.tenant, "kind": chosen.kind,
                 "cost": dict(victim.cost), "priority": victim.priority}
                for victim in chosen.victims]

    def check_invariants(self) -> list[str]:
        """Broken invariants plus usage over a cap, as one list: empty means all is well.

        For runs in which no cap is lowered (the demo, the tests), where usage above
        a cap can only mean an oversell. ``quotagate check`` uses :meth:`check_ledger`,
        which tells the two apart.
        """
        result = self.check_ledger()
        return result.violations + result.over_cap

    def check_ledger(self) -> LedgerCheck:
        """The accounting over the whole ledger (docs/invariants.md, 1 and 2).

        Usage above a cap is reported apart: lowering a cap below what is in use
        is allowed (admission then waits until usage drops), so over-cap is a
        state to show, not a broken invariant.
        """
        violations: list[str] = []
        over_cap: list[str] = []
        with reading(self.engine) as connection:
            rows = connection.execute(
                sa.select(
                    schema.request.c.id, schema.request.c.tenant, schema.request.c.pool,
                    schema.request.c.pool_slice, schema.request.c.state, schema.request.c.cost,
                    schema.outbox.c.request_id.label("outbox_id"), schema.outbox.c.delivered,
                ).select_from(
                    schema.request.outerjoin(
                        schema.outbox, schema.outbox.c.request_id == schema.request.c.id
                    )
                ).where(
                    schema.request.c.state.in_([s.value for s in CHARGED_STATES])
                )
            ).all()
            tenants, pools = all_usage(connection)
            topics = connection.execute(sa.select(
                schema.topic.c.tenant, schema.topic.c.partitions, schema.topic.c.parallelism
            )).all()
            orphans = connection.execute(
                sa.select(schema.outbox.c.request_id)
                .select_from(
                    schema.outbox.join(
                        schema.request, schema.request.c.id == schema.outbox.c.request_id
                    )
                )
                .where(
                    schema.outbox.c.delivered == sa.false(),
                    schema.request.c.state.not_in(
                        [RequestState.RESERVED.value,
                         *(state.value for state in STOPPING_STATES)]
                    ),
                )
            ).scalars().all()
            connection_rows = cohorts.read_for_check(connection)
            # Use moved between a pool's slices leaves the sums right: check each slice.
            violations += pool_slices.check(
                connection, ((row.pool, row.pool_slice, decode_cost(row.cost)) for row in rows))
        members = connection_rows.member_names
        tenant_costs: dict[str, list[dict[str, int]]] = {}
        pool_costs: dict[str, list[dict[str, int]]] = {}
        # A topic charges its tenant's quota in partitions and parallelism (docs/streams.md).
        for tenant, partitions, parallelism in topics:
            tenant_costs.setdefault(tenant, []).append(
                {"partitions": partitions, "parallelism": parallelism})
        for row in rows:
            cost = decode_cost(row.cost)
            tenant_costs.setdefault(row.tenant, []).append(cost)
            pool_costs.setdefault(row.pool, []).append(cost)
            if row.outbox_id is None:
                violations.append(f"request {row.id} is {row.state} without an outbox row")
            elif row.state == RequestState.RESERVED.value and row.delivered:
                violations.append(f"request {row.id} is reserved but its outbox says delivered")
        for request_id in orphans:
            violations.append(f"outbox row {request_id} is pending for a request not reserved")
        for holder, usage, costs in (("tenant", tenants, tenant_costs), ("pool", pools, pool_costs)):
            for name in sorted(set(usage) | set(costs)):
                expected = total_cost(costs.get(name, []))
                for resource in sorted(set(usage.get(name, {})) | set(expected)):
                    used, cap = usage.get(name, {}).get(resource, (0, 0))
                    if used != expected.get(resource, 0):
                        violations.append(
                            f"{holder} {name} {resource}: used {used} but reserved requests "
                            f"cost {expected.get(resource, 0)}"
                        )
                    # A cohort member may be above its nominal share by borrowing; the
                    # cohort invariants below say whether that is within its limits.
                    if used > cap and (holder == "pool" or name not in members):
                        over_cap.append(f"{holder} {name} {resource}: used {used} > cap {cap}")
        violations += cohorts.check(connection_rows)
        with reading(self.engine) as connection:
            violations += budget_views.check(connection)
        return LedgerCheck(violations, over_cap)
