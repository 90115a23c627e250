"""What a preemption decision reads (the running work that could make room) and locks.

Shared by the ledger (which marks the victims) and the dry run (which names them
in ``would_preempt``), so both choose from the same rows.

A decision holds the ledger-wide decision lock, which comes after request rows
in the lock order (docs/decisions/041-one-lock-order.md): a release holding a
victim's row may be waiting for it. So the victims' rows are taken with SKIP
LOCKED, never waited for (:func:`lock_victims`).
"""

from __future__ import annotations

import json

import sqlalchemy as sa

from quotagate.domain.model import RequestState
from quotagate.domain.preemption import Running
from quotagate.store import schema
from quotagate.store.dialect import supports_skip_locked

# Stopping already: their cost is coming back, none is a victim — a victim's stop, a
# time limit's (docs/decisions/714), a cancel's (716) and an admin's complete or fail
# (819). The held room's guard counts the same work as coming back (store/holds.py): it must judge as the decision that
# wrote the hold did. Their confirmed stops take the decision lock (store/release.py).
COMING_BACK = (RequestState.CANCELLING.value, RequestState.COMPLETING.value,
               RequestState.FAILING.value, RequestState.PREEMPTING.value,
               RequestState.TIMING_OUT.value)
_CANDIDATE_STATES = (RequestState.RESERVED.value, RequestState.DELIVERED.value, *COMING_BACK)


def running_work(connection: sa.Connection, tenants: set[str]) -> list[Running]:
    """Charged requests of ``tenants`` and of every member of their cohort trees.

    ``admitted`` is the outbox row's creation, the moment of admission; work
    already stopping (``COMING_BACK``) comes back marked ``stopping``. The cohort trees are
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
                    float(row.admitted), stopping=row.state in COMING_BACK)
            for row in rows]


def lock_victims(connection: sa.Connection, victims: list[str]) -> bool:
    """Lock the chosen victims' request rows unless another transaction holds one.

    False: some victim is being ended (or stopped) right now; the decision is
    dropped and the next pass chooses again. Waiting for it instead, while
    holding the decision lock, closes a cycle with a release whose batch also
    confirms a stop (it holds the victim's row and waits for the decision lock).
    SQLite's one writer needs no row lock.
    """
    if not supports_skip_locked(connection):
        return True
    request = schema.request
    got = set(connection.execute(
        sa.select(request.c.id).where(request.c.id.in_(sorted(victims)))
        .order_by(request.c.id).with_for_update(skip_locked=True)).scalars())
    return got == set(victims)
