"""What the metrics endpoint reads from the ledger tables at scrape time, in one read.

Every process reports the same cluster-wide numbers from these queries
(docs/decisions/304); ``observability.metrics.LedgerCollector`` turns them into
Prometheus families. Each query is one GROUP BY over an indexed column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.model import RequestState
from quotagate.domain.preemption import PREEMPTION_KINDS
from quotagate.store import schema
from quotagate.store.dashboard import UNCONFIRMED_STOP_STATES
from quotagate.store.dialect import reading
from quotagate.store.rows import all_usage

__all__ = ["Backlog", "LedgerGauges", "StopsPending", "Waiting", "read_gauges"]

# name -> resource -> (used, cap)
Usage = dict[str, dict[str, tuple[int, int]]]


@dataclass(frozen=True)
class Waiting:
    tenant: str
    count: int
    oldest_created: float


@dataclass(frozen=True)
class Backlog:
    """A tenant's outbox rows: undelivered, attempts so far, failing, stopping."""

    tenant: str
    pending: int
    attempts: int
    failing: int
    stopping: int


@dataclass(frozen=True)
class StopsPending:
    tenant: str
    state: str
    count: int
    oldest_updated: float


@dataclass(frozen=True)
class LedgerGauges:
    tenants: Usage
    pools: Usage
    waiting: list[Waiting]
    # (tenant, state) -> count, for the states a request ends in without running
    ended: dict[tuple[str, str], int]
    # (tenant, kind) -> victims whose stop was confirmed (kind: PREEMPTION_KINDS)
    preempted: dict[tuple[str, str], int]
    backlog: list[Backlog]
    # lease name -> generation
    lease_generations: dict[str, int]
    stops: list[StopsPending]
    # tenant -> requeues after preemption (attempts beyond the first) of its requests
    requeued: dict[str, int] = field(default_factory=dict)
    # tenant -> its waiting preemptors whose freed room is held
    held: dict[str, int] = field(default_factory=dict)


def read_gauges(engine: Engine) -> LedgerGauges:
    request, outbox = schema.request, schema.outbox
    with reading(engine) as connection:
        tenants, pools = all_usage(connection)
        waiting = connection.execute(
            sa.select(request.c.tenant, sa.func.count(), sa.func.min(request.c.created))
            .where(request.c.state == RequestState.WAITING.value)
            .group_by(request.c.tenant)
        ).all()
        ended = connection.execute(
            sa.select(request.c.tenant, request.c.state, sa.func.count())
            .where(request.c.state.in_([RequestState.EXPIRED.value, RequestState.REJECTED.value]))
            .group_by(request.c.tenant, request.c.state)
        ).all()
        # The kind is the victim's reason's (Ledger._preempt writes "preempted (KIND) by ID").
        kind = sa.case(*((request.c.reason.like(f"preempted ({name})%"), name)
                         for name in PREEMPTION_KINDS), else_="other").label("kind")
        preempted = connection.execute(
            sa.select(request.c.tenant, kind, sa.func.count())
            .where(request.c.state == RequestState.PREEMPTED.value)
            .group_by(request.c.tenant, kind)
        ).all()
        pending = sa.and_(outbox.c.delivered == sa.false(), outbox.c.stopping == sa.false())
        deliveries = connection.execute(
            sa.select(
                outbox.c.tenant,
                sa.func.sum(sa.case((pending, 1), else_=0)),
                sa.func.sum(outbox.c.attempts),
                sa.func.sum(sa.case((sa.and_(pending, outbox.c.last_error.is_not(None)), 1), else_=0)),
                sa.func.sum(sa.case((outbox.c.stopping == sa.true(), 1), else_=0)),
            ).group_by(outbox.c.tenant)
        ).all()
        leases = connection.execute(sa.select(schema.lease.c.name, schema.lease.c.generation)).all()
        stops = connection.execute(
            sa.select(request.c.tenant, request.c.state, sa.func.count(), sa.func.min(request.c.updated))
            .where(request.c.state.in_(UNCONFIRMED_STOP_STATES))
            .group_by(request.c.tenant, request.c.state)
        ).all()
        # Only preemption's victims carry preempted_by (an index of mostly NULLs).
        requeued = connection.execute(
            sa.select(request.c.tenant, sa.func.sum(request.c.attempt - 1))
            .where(request.c.preempted_by.is_not(None)).group_by(request.c.tenant)
        ).all()
        held = connection.execute(
            sa.select(schema.hold.c.tenant, sa.func.count()).group_by(schema.hold.c.tenant)
        ).all()
    return LedgerGauges(
        tenants=tenants,
        pools=pools,
        waiting=[Waiting(tenant, int(count), float(first)) for tenant, count, first in waiting],
        ended={(tenant, state): int(count) for tenant, state, count in ended},
        preempted={(tenant, name): int(count) for tenant, name, count in preempted},
        backlog=[
            Backlog(tenant, int(pending_count or 0), int(attempt_count or 0), int(failing_count or 0),
                    int(stop_count or 0))
            for tenant, pending_count, attempt_count, failing_count, stop_count in deliveries
        ],
        lease_generations={name: int(generation) for name, generation in leases},
        stops=[StopsPending(tenant, state, int(count), float(first)) for tenant, state, count, first in stops],
        requeued={tenant: int(count or 0) for tenant, count in requeued if count},
        held={tenant: int(count) for tenant, count in held},
    )
