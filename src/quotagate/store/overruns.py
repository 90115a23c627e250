"""Work past its max-runtime, stopped where its tenant asks for it (docs/decisions/714).

A tenant with ``stop_at_max_runtime`` has its running work (``reserved`` or
``delivered``) stopped once its max-runtime — declared, else the tenant's
default at submission (``reserved_runtime``) — and the tenant's grace past it
(``max_runtime_grace``, docs/decisions/715) have passed since admission. The
stop is a cancel's stop (docs/decisions/211): the request moves to
``timing_out`` (charged, stopping), its outbox row becomes a stop for a worker,
and the target's confirmed stop ends it ``timed_out`` and returns its cost once
(:mod:`quotagate.store.release`).

Workers look once per pass (:func:`stop_overruns`): one statement that starts
from the tenants that opt in (an index on the flag), so a ledger where none does
answers from the index alone. Each move is conditional on the state and the
admission the read saw, so several workers never stop one request twice, and a
request requeued and admitted again meanwhile is judged on its new admission.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.budget import overrun_reason
from quotagate.domain.model import RequestState
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import reading, run_transaction
from quotagate.store.release import mark_stop

__all__ = ["Overrun", "overruns_query", "stop_overruns"]

_RUNNING = (RequestState.RESERVED.value, RequestState.DELIVERED.value)
# At most this many stops begun per pass; the rest wait for the next one.
DEFAULT_LIMIT = 256

Overrun = tuple[str, str, int, float, int]  # id, tenant, reserved_runtime, admitted, grace


@lru_cache(maxsize=1)
def overruns_query() -> sa.Select[Any]:
    """Running work of tenants that stop at the max-runtime, past it and the grace at ``:now``."""
    tenant, request = schema.tenant, schema.request
    return (
        sa.select(request.c.id, request.c.tenant, request.c.reserved_runtime, request.c.admitted,
                  tenant.c.max_runtime_grace)
        .select_from(tenant.join(request, request.c.tenant == tenant.c.name))
        .where(tenant.c.stop_at_max_runtime == sa.true(),
               request.c.state.in_(_RUNNING),
               request.c.reserved_runtime.is_not(None),
               # The grace is the tenant's, read with it: a change applies at the next look.
               request.c.admitted + request.c.reserved_runtime + tenant.c.max_runtime_grace
               <= sa.bindparam("now", type_=sa.Double()))
        # No ORDER BY: SQLite would then walk the whole table in id order. The
        # moves are put in id order in Python (_begin).
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )


def stop_overruns(engine: Engine, now: float, *, actor: str,
                  limit: int = DEFAULT_LIMIT) -> list[str]:
    """Begin the stop of every overrun found at ``now``; the ids this call moved.

    One read when there is nothing to stop; otherwise one transaction more, whose
    every move is conditional (another worker may have begun the same stop).
    """
    # One statement that takes no lock: no transaction around it (on PostgreSQL
    # that saves the BEGIN and ROLLBACK round trips of every pass).
    with reading(engine, single_statement=True) as connection:
        found: list[Overrun] = [
            (row.id, row.tenant, int(row.reserved_runtime), float(row.admitted),
             int(row.max_runtime_grace))
            for row in connection.execute(overruns_query(), {"now": now, "limit": limit})]
    if not found:
        return []
    return run_transaction(engine, lambda connection: _begin(connection, found, now, actor))


def _begin(connection: sa.Connection, found: list[Overrun], now: float,
           actor: str) -> list[str]:
    request = schema.request
    moved: list[str] = []
    # One row at a time, in id order (the order every batch locks request rows in).
    for request_id, tenant, runtime, admitted, grace in sorted(found):
        reason = overrun_reason(runtime, grace)
        changed = connection.execute(
            request.update()
            .where(request.c.id == request_id, request.c.state.in_(_RUNNING),
                   request.c.admitted == admitted)
            .values(state=RequestState.TIMING_OUT.value, updated=now, reason=reason)
        ).rowcount
        if changed != 1:
            continue  # ended, stopped or stopped by another worker since the read
        mark_stop(connection, request_id)
        record(connection, now, AuditEntry(actor, "timeout", "stopping", tenant, request_id,
                                           reason))
        moved.append(request_id)
    return moved
