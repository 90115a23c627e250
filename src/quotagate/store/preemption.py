"""What a preemption decision reads: the running work that could make room.

Shared by the ledger (which marks the victims) and the dry run (which names them
in ``would_preempt``), so both choose from the same rows.
"""

from __future__ import annotations

import json

import sqlalchemy as sa

from quotagate.domain.model import RequestState
from quotagate.domain.preemption import Running
from quotagate.store import schema

_CANDIDATE_STATES = (RequestState.RESERVED.value, RequestState.DELIVERED.value,
                     RequestState.PREEMPTING.value)


def running_work(connection: sa.Connection, tenants: set[str]) -> list[Running]:
    """Charged requests of ``tenants`` and of every member of their cohort trees.

    ``admitted`` is the outbox row's creation, the moment of admission; work
    already ``preempting`` comes back marked ``stopping``. The cohort trees are
    found in the same statement (quota rows' ``cohort_root``), so this read
    needs nothing read before it (the order of reads: Ledger._preempt).
    """
    request, outbox, quota = schema.request, schema.outbox, schema.tenant_quota
    names = sorted(tenants)
    their_roots = sa.select(quota.c.cohort_root).where(quota.c.tenant.in_(names),
                                                       quota.c.cohort_root.is_not(None))
    neighbours = sa.select(quota.c.tenant).where(quota.c.cohort_root.in_(their_roots))
    rows = connection.execute(
        sa.select(request.c.id, request.c.tenant, request.c.pool, request.c.cost,
                  request.c.priority, request.c.state, outbox.c.created.label("admitted"))
        .select_from(request.join(outbox, outbox.c.request_id == request.c.id))
        .where(sa.or_(request.c.tenant.in_(names), request.c.tenant.in_(neighbours)),
               request.c.state.in_(_CANDIDATE_STATES))
    )
    return [Running(row.id, row.tenant, row.pool, json.loads(row.cost), int(row.priority),
                    float(row.admitted), stopping=row.state == RequestState.PREEMPTING.value)
            for row in rows]
