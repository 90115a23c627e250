"""The dashboard's views: one read, one query per view, scoped to a tenant or to everyone.

``snapshot`` feeds ``GET /v1/dashboard``, the page at ``/ui/`` and
``quotagate top``; ``story`` feeds a request's page. Every query is bounded
(the head of the queue, the newest decisions, the oldest undelivered rows) so
the cost of a poll does not grow with the ledger, and the whole read runs
under the read deadline (quotagate.store.read_deadline). See docs/dashboard.md.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.bucket import BucketConfig, BucketState, refill
from quotagate.domain.budget import BudgetState, format_duration
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.dry_run import fits_today, judge, waiting_reason
from quotagate.domain.explanation import explain_waiting
from quotagate.domain.model import RequestState
from quotagate.domain.ordering import effective_priority
from quotagate.domain.placement import Candidate
from quotagate.domain.preemption import HeldRoom
from quotagate.domain.sharing import standings
from quotagate.store import budgets, cohorts, fair_history, holds, schema, statements
from quotagate.store.dialect import database_now, reading
from quotagate.store.rows import decode_cost, request_from_row, visible_request_row


class StreamsSection(Protocol):
    """The Streams view, read from the stream Redis above the store (streams.overview)."""

    def to_dict(self) -> dict[str, Any]: ...


# States of a stop or preemption that the executor has not confirmed yet: the
# cost is still charged and comes back only once it does (the delivery engine
# adds these states; they are counted by name so this view needs no change then).
UNCONFIRMED_STOP_STATES = ("cancelling", "completing", "failing", "preempting", "timing_out")
# Audit entries that move a request into or out of the waiting queue (a requeued
# victim waits again: quotagate.store.requeue).
_ENTERS_QUEUE = (("submit", "accepted"), ("requeue", "waiting"))
_LEAVES_QUEUE = (("admit", "reserved"), ("expire", "expired"), ("cancelled", "ok"))
HISTORY_MINUTES = 60


@dataclass(frozen=True)
class UsageRow:
    name: str
    resource: str
    used: int
    cap: int


@dataclass(frozen=True)
class TenantRow:
    """A tenant's use of one resource; in a cohort its cap is its nominal share.

    ``cohort`` is the tenant's own cohort (None: a plain tenant, whose
    ``borrowed`` and ``lent`` are 0); ``borrowed`` is its use above the nominal,
    ``lent`` its share of what the other members borrow (docs/fair-sharing.md).
    """

    name: str
    resource: str
    used: int
    cap: int
    cohort: str | None = None
    nominal: int = 0
    borrowed: int = 0
    lent: int = 0
    # The most this tenant may use: nominal + borrowing limit (None: the room decides).
    ceiling: int | None = None
    # Its budget on this resource as admission judges it (None: no budget), in
    # resource-hours: released usage its window still counts, what running work
    # reserves, what is left of the limit (``100h/30d``) (docs/decisions/613).
    budget_spent_hours: float | None = None
    budget_reserved_hours: float | None = None
    budget_left_hours: float | None = None
    budget_limit: str | None = None


@dataclass(frozen=True)
class QueueEntry:
    position: int
    id: str
    tenant: str
    cost: dict[str, int]
    priority: int
    effective_priority: float
    waited_seconds: float
    reason: str


@dataclass(frozen=True)
class DecisionEntry:
    id: int
    at: float
    actor: str
    tenant: str | None
    operation: str
    target: str | None
    outcome: str
    reason: str | None


@dataclass(frozen=True)
class DeliveryEntry:
    request_id: str
    tenant: str
    state: str
    target: str | None
    attempts: int
    age_seconds: float
    next_attempt_in: float
    claimed_by: str | None
    fencing_token: int
    # The target's own words are for operators (docs/decisions/214): None for a tenant,
    # who sees only that the last attempt failed.
    last_error: str | None
    failing: bool = False


@dataclass(frozen=True)
class StopEntry:
    id: str
    tenant: str
    state: str
    pool: str | None
    cost: dict[str, int]
    since_seconds: float
    reason: str | None
    # Stop attempts the target did not confirm and, for operators only, its last answer:
    # a failure to ask (``last_error``, and then ``failing``) or the stop's progress.
    attempts: int = 0
    last_error: str | None = None
    failing: bool = False
    progress: str | None = None


@dataclass(frozen=True)
class HoldEntry:
    """A waiting preemptor whose freed room admission holds for it (docs/decisions/721)."""

    id: str
    tenant: str
    cost: dict[str, int]


@dataclass(frozen=True)
class BucketEntry:
    key: str
    tenant: str
    topic: str | None
    capacity: float
    refill_per_second: float
    tokens: float


@dataclass(frozen=True)
class MinuteEntry:
    minute: float
    admitted: int
    rejected: int
    queue_depth: int


@dataclass(frozen=True)
class Snapshot:
    at: float
    tenant: str | None
    tenants: list[TenantRow]
    pools: list[UsageRow]
    waiting: int
    queue: list[QueueEntry]
    decisions: list[DecisionEntry]
    backlog: int
    deliveries: list[DeliveryEntry]
    stops: list[StopEntry]
    buckets: list[BucketEntry]
    history: list[MinuteEntry] = field(default_factory=list)
    # The shared room of each root cohort (admins only, as GET /v1/usage).
    cohorts: list[UsageRow] = field(default_factory=list)
    # Read from the stream Redis by Quotagate.dashboard (quotagate.streams.overview).
    streams: StreamsSection | None = None
    # Preemptors with a live hold on freed room, oldest hold first (in the tenant's scope).
    holds: list[HoldEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DashboardViews:
    """Read-only views for the dashboard; ``tenant`` narrows every one of them."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock | None = None,
        aging_interval: float = 30.0,
        admission_window: int = 32,
        rows: int = 50,
    ) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()
        self.aging_interval = aging_interval
        self.admission_window = admission_window
        self.rows = rows
        # Per scope (None: everyone), the counts of minutes that are over:
        # (admitted, rejected, entered the queue, left it).
        self._finished: dict[str | None, dict[int, tuple[int, int, int, int]]] = {}
        self._history_lock = threading.Lock()

    def snapshot(self, tenant: str | None = None, *, operator: bool | None = None) -> Snapshot:
        """``operator`` (default: an unscoped read) also gets the targets' error texts."""
        operator = tenant is None if operator is None else operator
        now = self.clock.now()
        with reading(self.engine) as connection:
            # Usage, limits and rooms as admission plans on them, in one round trip:
            # a member's borrowed and lent need every member of its tree, whatever the scope.
            usage = cohorts.snapshot_from_rows(
                connection.execute(statements.admission_snapshot_query()))
            tenant_cohorts = dict(connection.execute(
                sa.select(schema.tenant.c.name, schema.tenant.c.cohort)
                .order_by(schema.tenant.c.name)).all())
            if usage.budgeted:
                # Every budget with its window's usage, one statement for all tenants:
                # what admission reads, for the column and for the reasons.
                usage.budgets = budgets.read_budgets(connection, now)
            # Held room, as admission and explain judge it; read only when a hold
            # exists, so a poll without holds costs no statement more.
            guard = holds.read_guard(connection, now) if usage.holds else None
            waiting, queue = self._queue(connection, tenant, usage, list(tenant_cohorts), now,
                                         guard)
            decisions = self._decisions(connection, tenant)
            backlog, deliveries = self._deliveries(connection, tenant, now, operator)
            stops = self._stops(connection, tenant, now, operator)
            buckets = self._buckets(connection, tenant)
            history = self._history(connection, tenant, waiting, now)
        return Snapshot(
            at=now, tenant=tenant, tenants=_tenant_rows(usage, tenant_cohorts, tenant),
            pools=_usage_rows(usage.pools),
            waiting=waiting, queue=queue, decisions=decisions, backlog=backlog,
            deliveries=deliveries, stops=stops, buckets=buckets, history=history,
            cohorts=_usage_rows(usage.sharing.cohorts) if tenant is None else [],
            holds=[] if guard is None else [
                HoldEntry(holder.id, holder.tenant, dict(holder.cost))
                for holder in guard.holders if tenant is None or holder.tenant == tenant],
        )

    def story(self, request_id: str, tenant: str | None = None, *,
              operator: bool | None = None) -> dict[str, Any]:
        """A request's whole story: its row, every audit entry about it, binding and outbox."""
        operator = tenant is None if operator is None else operator
        audit, binding, outbox = schema.audit, schema.binding, schema.outbox
        with reading(self.engine) as connection:
            row = visible_request_row(connection, request_id, tenant)
            entries = connection.execute(
                sa.select(audit)
                .where(audit.c.target == request_id, audit.c.tenant == row["tenant"])
                .order_by(audit.c.id)
                .limit(500)
            ).mappings().all()
            bound = connection.execute(
                sa.select(binding).where(binding.c.request_id == request_id)
            ).mappings().first()
            delivery = connection.execute(
                sa.select(outbox).where(outbox.c.request_id == request_id)
            ).mappings().first()
        return {
            "request": request_from_row(row).to_dict(),
            "history": [dict(entry) for entry in entries],
            "binding": None if bound is None else {
                "target": bound["target"], "external_name": bound["external_name"],
                "uid": bound["uid"], "fencing_token": bound["fencing_token"],
                "created": bound["created"],
            },
            "delivery": None if delivery is None else {
                "target": delivery["target"], "attempts": delivery["attempts"],
                "delivered": bool(delivery["delivered"]), "delivered_at": delivery["delivered_at"],
                "next_attempt_at": delivery["next_attempt_at"],
                "claimed_by": delivery["claimed_by"],
                "fencing_token": delivery["claim_token"],
                "last_error": delivery["last_error"] if operator else None,
                "failing": delivery["last_error"] is not None,
                "stop_progress": delivery["stop_progress"] if operator else None,
            },
        }

    # -- one query each ----------------------------------------------------------

    def _queue(
        self,
        connection: sa.Connection,
        tenant: str | None,
        usage: cohorts.Snapshot,
        every_tenant: list[str],
        now: float,
        guard: HeldRoom | None = None,
    ) -> tuple[int, list[QueueEntry]]:
        request = schema.request
        waiting = sa.select(sa.func.count()).where(request.c.state == RequestState.WAITING.value)
        if tenant is not None:
            waiting = waiting.where(request.c.tenant == tenant)
        total = int(connection.execute(waiting).scalar_one())
        if total == 0:
            return 0, []
        # A member's reason depends on what the other members' heads take first,
        # and a budget's on which of its tenant's requests the next pass places
        # first, and held room on what every tenant's heads take, so with cohorts,
        # budgets or holds every tenant's head is read, whatever the scope.
        scoped = (tenant is not None and not usage.sharing.roots and not usage.budgeted
                  and not usage.holds)
        names = [tenant] if scoped else every_tenant
        # The first rows of the whole queue are among the first rows of each tenant's
        # queue: one bounded index range scan per tenant, merged here, as admission reads it.
        heads = sorted(connection.execute(_head_query(len(names),
                                                      max(self.rows, self.admission_window)),
                                          {f"tenant_{i}": name for i, name in enumerate(names)}),
                       key=lambda row: (row.queue_key, row.created, row.id))
        rows = [row for row in heads if tenant is None or row.tenant == tenant][:self.rows]
        # What admission's next pass reads: the first `admission_window` of each tenant.
        window: list[Candidate] = []
        placed: dict[str, int] = {}
        for head in heads:
            placed[head.tenant] = placed.get(head.tenant, 0) + 1
            if placed[head.tenant] <= self.admission_window:
                window.append(Candidate(head.id, head.tenant, decode_cost(head.cost),
                                        head.reserved_runtime))
        # In queue order every request of a tenant ahead of this one is listed
        # before it, so the tenant positions counted here are exact.
        seen: dict[str, int] = {}
        entries = []
        for position, row in enumerate(rows, start=1):
            seen[row.tenant] = seen.get(row.tenant, 0) + 1
            cost = decode_cost(row.cost)
            reason = self._reason(row, cost, seen[row.tenant], usage, window, now, guard)
            entries.append(QueueEntry(
                position=position, id=row.id, tenant=row.tenant, cost=cost,
                priority=row.priority,
                effective_priority=round(
                    effective_priority(row.priority, row.created, now, self.aging_interval), 3),
                waited_seconds=round(max(0.0, now - row.created), 3),
                reason=reason,
            ))
        return total, entries

    def _reason(self, row: Any, cost: dict[str, int], tenant_position: int,
                usage: cohorts.Snapshot, window: list[Candidate], now: float,
                guard: HeldRoom | None = None) -> str:
        """The sentence ``explain`` gives for this request (LedgerViews.explain)."""
        plain = explain_waiting(cost, usage.tenants.get(row.tenant, {}), usage.pools,
                                tenant_position, self.admission_window)
        if (guard is None and not usage.sharing.is_member(row.tenant)
                and row.tenant not in usage.budgets.tenants and not fits_today(plain)):
            return plain.reason
        # A member's quota is a nominal share: its limits, its cohort and what the
        # next pass places before it decide (the dry run's verdict); a budget and
        # held room are not in the usage rows the plain sentence judges; and what
        # fits today's usage may not fit what the next pass places first.
        request = Candidate(row.id, row.tenant, cost, row.reserved_runtime)
        queue = window if any(entry.id == row.id for entry in window) else [*window, request]
        verdict = judge(request, queue=queue, tenants=usage.tenants, pools=usage.pools,
                        sharing=usage.sharing, weights=usage.weights,
                        tenant_position=tenant_position, admission_window=self.admission_window,
                        budgets=usage.budgets, history=fair_history.history(usage, now),
                        guard=guard)
        return waiting_reason(verdict, plain, self.admission_window)

    def _decisions(self, connection: sa.Connection, tenant: str | None) -> list[DecisionEntry]:
        audit = schema.audit
        query = sa.select(audit)
        if tenant is not None:
            query = query.where(audit.c.tenant == tenant)
        rows = connection.execute(query.order_by(audit.c.id.desc()).limit(self.rows)).mappings()
        return [DecisionEntry(**dict(row)) for row in rows]

    def _deliveries(
        self, connection: sa.Connection, tenant: str | None, now: float, operator: bool
    ) -> tuple[int, list[DeliveryEntry]]:
        outbox, request = schema.outbox, schema.request
        query = (
            sa.select(
                outbox.c.request_id, outbox.c.tenant, request.c.state, outbox.c.target,
                outbox.c.attempts, outbox.c.created, outbox.c.next_attempt_at,
                outbox.c.claimed_by, outbox.c.claim_token, outbox.c.last_error,
                sa.func.count().over().label("total"),
            )
            .select_from(outbox.join(request, request.c.id == outbox.c.request_id))
            .where(outbox.c.delivered == sa.false())
        )
        if tenant is not None:
            query = query.where(outbox.c.tenant == tenant)
        rows = connection.execute(
            query.order_by(outbox.c.created, outbox.c.request_id).limit(self.rows)
        ).all()
        entries = [
            DeliveryEntry(
                request_id=row.request_id, tenant=row.tenant, state=row.state, target=row.target,
                attempts=int(row.attempts), age_seconds=round(max(0.0, now - row.created), 3),
                next_attempt_in=round(max(0.0, row.next_attempt_at - now), 3),
                claimed_by=row.claimed_by, fencing_token=int(row.claim_token),
                last_error=row.last_error if operator else None,
                failing=row.last_error is not None,
            )
            for row in rows
        ]
        return (int(rows[0].total) if rows else 0), entries

    def _stops(self, connection: sa.Connection, tenant: str | None, now: float,
               operator: bool) -> list[StopEntry]:
        request, outbox = schema.request, schema.outbox
        query = sa.select(
            request.c.id, request.c.tenant, request.c.state, request.c.pool, request.c.cost,
            request.c.updated, request.c.reason, outbox.c.attempts, outbox.c.last_error,
            outbox.c.stop_progress,
        ).select_from(request.outerjoin(outbox, outbox.c.request_id == request.c.id)).where(
            request.c.state.in_(UNCONFIRMED_STOP_STATES))
        if tenant is not None:
            query = query.where(request.c.tenant == tenant)
        rows = connection.execute(query.order_by(request.c.updated).limit(self.rows)).all()
        return [
            StopEntry(id=row.id, tenant=row.tenant, state=row.state, pool=row.pool,
                      cost=decode_cost(row.cost),
                      since_seconds=round(max(0.0, now - row.updated), 3), reason=row.reason,
                      attempts=int(row.attempts or 0),
                      last_error=row.last_error if operator else None,
                      failing=row.last_error is not None,
                      progress=row.stop_progress if operator else None)
            for row in rows
        ]

    def _buckets(self, connection: sa.Connection, tenant: str | None) -> list[BucketEntry]:
        bucket = schema.rate_bucket
        query = sa.select(bucket, database_now(connection).label("now"))
        if tenant is not None:
            query = query.where(bucket.c.tenant == tenant)
        rows = connection.execute(query.order_by(bucket.c.key).limit(self.rows)).all()
        entries = []
        for row in rows:
            config = BucketConfig(float(row.capacity), float(row.refill_per_second))
            # The tokens as of the database's clock, the clock the buckets refill by.
            state = refill(config, BucketState(float(row.tokens), float(row.updated)),
                           float(row.now))
            _, _, topic = row.key.partition(":")
            entries.append(BucketEntry(
                key=row.key, tenant=row.tenant, topic=topic or None,
                capacity=config.capacity, refill_per_second=config.refill_per_second,
                tokens=round(state.tokens, 3),
            ))
        return entries

    def _history(
        self, connection: sa.Connection, tenant: str | None, waiting: int, now: float
    ) -> list[MinuteEntry]:
        """Admissions and rejections per minute over the last hour, and the queue depth.

        The depth is replayed backwards from the waiting count now: a minute's
        depth at its end is the next minute's depth, less what entered the queue
        in that next minute, plus what left it. Minutes that ended before the
        previous one are kept from earlier polls, so a poll reads the audit
        entries of two minutes, not of an hour.
        """
        current = int(now // 60)
        first = current - HISTORY_MINUTES + 1
        with self._history_lock:
            known = self._finished.setdefault(tenant, {})
            for stale in [minute for minute in known if minute < first]:
                del known[stale]
            missing = [minute for minute in range(first, current - 1) if minute not in known]
        since = missing[0] if missing else current - 1
        counts = {minute: [0, 0, 0, 0] for minute in range(since, current + 1)}
        for row in connection.execute(_minutes_query(tenant is not None),
                                      {"since": since * 60.0, "tenant": tenant}):
            minute = int(row.minute)
            if minute not in counts:
                continue  # written by a clock ahead of ours
            pair, amount = (row.operation, row.outcome), int(row.n)
            counts[minute][0] += amount if pair == ("admit", "reserved") else 0
            counts[minute][1] += amount if pair == ("submit", "rejected") else 0
            counts[minute][2] += amount if pair in _ENTERS_QUEUE else 0
            counts[minute][3] += amount if pair in _LEAVES_QUEUE else 0
        read = {minute: (admitted, rejected, entered, left)
                for minute, (admitted, rejected, entered, left) in counts.items()}
        with self._history_lock:
            known = self._finished.setdefault(tenant, {})
            known.update((minute, read[minute]) for minute in range(since, current - 1))
            every = {**known, **read}
        depth = waiting
        minutes = []
        for index in range(current, first - 1, -1):
            admitted, rejected, entered, left = every.get(index, (0, 0, 0, 0))
            minutes.append(MinuteEntry(float(index * 60), admitted, rejected, max(0, depth)))
            depth = depth - entered + left
        minutes.reverse()
        return minutes


@lru_cache(maxsize=2)
def _minutes_query(scoped: bool) -> sa.Select[Any]:
    """Audit entries since ``since`` by minute, operation and outcome (of ``tenant`` if scoped)."""
    audit = schema.audit
    minute = sa.func.floor(audit.c.at / 60).label("minute")
    query = (
        sa.select(minute, audit.c.operation, audit.c.outcome, sa.func.count().label("n"))
        .where(audit.c.at >= sa.bindparam("since", type_=sa.Double))
        .group_by(minute, audit.c.operation, audit.c.outcome)
    )
    if scoped:
        query = query.where(audit.c.tenant == sa.bindparam("tenant"))
    return query


@lru_cache(maxsize=64)
def _head_query(tenant_count: int, rows: int) -> sa.Select[Any] | sa.CompoundSelect[Any]:
    """The first ``rows`` waiting requests of each of ``tenant_count`` tenants (``tenant_i``)."""
    request = schema.request
    heads = [
        sa.select(request.c.id, request.c.tenant, request.c.cost, request.c.priority,
                  request.c.queue_key, request.c.created, request.c.reserved_runtime)
        .where(request.c.tenant == sa.bindparam(f"tenant_{index}"),
               request.c.state == RequestState.WAITING.value)
        .order_by(request.c.queue_key, request.c.created, request.c.id)
        .limit(rows)
        .subquery(f"head_{index}")
        for index in range(tenant_count)
    ]
    if len(heads) == 1:
        return sa.select(heads[0])
    return sa.union_all(*(sa.select(head) for head in heads))


def _tenant_rows(usage: cohorts.Snapshot, tenant_cohorts: dict[str, str | None],
                 tenant: str | None) -> list[TenantRow]:
    standing = standings(usage.tenants, usage.sharing)
    rows = []
    for name, resources in sorted(usage.tenants.items()):
        if tenant is not None and name != tenant:
            continue
        for resource, (used, cap) in sorted(resources.items()):
            limits = usage.sharing.limits.get((name, resource))
            borrowed, lent = standing.get((name, resource), (0, 0))
            member = usage.sharing.is_member(name)
            ceiling: int | None = cap
            if member:
                ceiling = (None if limits is None or limits.borrowing_limit is None
                           else limits.ceiling)
            rows.append(TenantRow(
                name, resource, used, cap,
                cohort=(tenant_cohorts.get(name) or usage.sharing.roots[name]) if member else None,
                nominal=cap, borrowed=borrowed, lent=lent, ceiling=ceiling,
                **_budget_fields(usage.budgets.states.get((name, resource))),
            ))
    return rows


def _hours(seconds: int) -> float:
    return round(seconds / 3600, 3)


def _budget_fields(state: BudgetState | None) -> dict[str, Any]:
    """A budget's columns as the next admission pass sees it (``Budgets.blocking``)."""
    if state is None:
        return {}
    return {
        "budget_spent_hours": _hours(state.spent),
        "budget_reserved_hours": _hours(state.reserved),
        "budget_left_hours": _hours(max(0, state.left)),
        "budget_limit": f"{format_duration(state.amount)}/{format_duration(state.window)}",
    }


def _usage_rows(usage: dict[str, dict[str, tuple[int, int]]]) -> list[UsageRow]:
    return [
        UsageRow(name, resource, used, cap)
        for name, resources in sorted(usage.items())
        for resource, (used, cap) in sorted(resources.items())
    ]
