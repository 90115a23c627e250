"""A preempted victim back in the queue: ``--on-preempt requeue`` (docs/decisions/720).

The confirmed stop of a ``preempting`` request whose tenant requeues returns
its cost like any end (:mod:`quotagate.store.release`) and moves it to
``waiting`` instead of ``preempted``, keeping its submission time and queue key
(so its aging is not lost). In the same transaction it becomes a new delivery
attempt:

- ``attempt`` goes up by one: the external name of the next delivery hashes it,
  so the new object never meets the stopped one (a process run directory with
  its exit status, a Kubernetes object still deleting or suspended);
- ``token_floor`` takes the last fencing token of the stopped attempt (its
  outbox row's claim counter, read before that row is deleted): the next
  attempt's outbox row counts on from it, so every token it carries is larger;
- its pool and capacity slice are cleared (its next admission charges anew);
- its binding (the stopped object) is deleted, so the next delivery binds its own
  object; the audit entry names the stopped object's attempt and the preemptor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record

__all__ = ["REQUEUE", "requeue", "requeue_reason", "tenants_that_requeue"]

REQUEUE = "requeue"


def tenants_that_requeue(connection: sa.Connection, tenants: Iterable[str]) -> set[str]:
    """Which of ``tenants`` put their preempted work back in the queue."""
    tenant = schema.tenant
    names = sorted(set(tenants))
    if not names:
        return set()
    return set(connection.execute(
        sa.select(tenant.c.name).where(tenant.c.name.in_(names),
                                       tenant.c.on_preempt == REQUEUE)).scalars())


def requeue_reason(row: dict[str, Any]) -> str:
    return f"requeued after preemption by {row['preempted_by']}"


def requeue(connection: sa.Connection, rows: Sequence[dict[str, Any]], now: float,
            actor: str) -> None:
    """Make the moved ``rows`` (now waiting, cost returned) their next delivery attempt.

    Runs before the release deletes their outbox rows: the last token is read from them.
    """
    if not rows:
        return
    request, outbox, binding = schema.request, schema.outbox, schema.binding
    ids = sorted(row["id"] for row in rows)
    last_token = (sa.select(outbox.c.claim_token)
                  .where(outbox.c.request_id == request.c.id).scalar_subquery())
    connection.execute(
        request.update().where(request.c.id.in_(ids))
        # The pool and its capacity slice are forgotten with the cost: the next
        # admission may charge another pool, or an unsliced one that records no slice,
        # and a stale slice would send that charge back to the wrong row.
        .values(attempt=request.c.attempt + 1, pool=None, pool_slice=None,
                token_floor=sa.func.coalesce(last_token, request.c.token_floor)))
    connection.execute(binding.delete().where(binding.c.request_id.in_(ids)))
    record(connection, now, *(
        AuditEntry(actor, "requeue", "waiting", row["tenant"], row["id"],
                   f"attempt {int(row.get('attempt') or 1) + 1} after preemption by "
                   f"{row['preempted_by']}")
        for row in rows
    ))
    for row in rows:
        row["attempt"] = int(row.get("attempt") or 1) + 1
        row["pool"] = None
        row["pool_slice"] = None
