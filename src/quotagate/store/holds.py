"""The room a preemption frees, held for its preemptor (docs/decisions/721).

A preemption decision writes a hold row for its preemptor. While the preemptor
is waiting and the hold has not expired, admission lets nothing in that would
keep it from fitting once its victims' cost is back (the pure rule:
:class:`quotagate.domain.preemption.HeldRoom`). Admission deletes the hold in
the transaction that reserves the preemptor; decisions delete the holds that
expired or whose preemptor left the queue.

Admission judges held room from a snapshot taken under the ledger-wide decision
lock (:func:`quotagate.store.release.lock_decisions`'s row), which a victim's
confirmed stop takes too, so two admitters never both spend the same freed room.
Without holds (the usual case) admission takes no lock: the snapshot's ``h``
part is empty.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import RequestState
from quotagate.domain.placement import Candidate
from quotagate.domain.preemption import HeldRoom, Running
from quotagate.store import identity, schema
from quotagate.store.driver import DriverTransaction
from quotagate.store.preemption import COMING_BACK

__all__ = ["DEFAULT_HOLD_SECONDS", "clean", "clean_statement", "hold", "holders", "lock_query", "read_guard",
           "release_statement"]

# How long freed room waits for its preemptor: long enough for a stop with a grace
# period and a finalizer, short enough that a preemptor which can never fit (its
# tenant's quota lowered since) does not keep others out for long.
DEFAULT_HOLD_SECONDS = 600.0


@lru_cache(maxsize=1)
def lock_query() -> sa.Select[Any]:
    """The ledger-wide decision lock (the ledger identity row), as one statement."""
    meta = schema.ledger_meta
    return (sa.select(meta.c.value).where(meta.c.key == identity.LEDGER_ID_KEY)
            .with_for_update())


@lru_cache(maxsize=1)
def _holders_query() -> sa.Select[Any]:
    request, held = schema.request, schema.hold
    return (
        sa.select(request.c.id, request.c.tenant, request.c.cost)
        .select_from(held.join(request, request.c.id == held.c.request_id))
        .where(request.c.state == RequestState.WAITING.value,
               held.c.expires > sa.bindparam("now", type_=sa.Double))
        .order_by(held.c.created, held.c.request_id)
    )


@lru_cache(maxsize=1)
def _stopping_query() -> sa.Select[Any]:
    request, outbox = schema.request, schema.outbox
    return (
        sa.select(request.c.id, request.c.tenant, request.c.pool, request.c.cost,
                  request.c.priority, outbox.c.created)
        .select_from(request.join(outbox, outbox.c.request_id == request.c.id))
        # timing_out, cancelling, completing and failing too: the decision that wrote the
        # hold counted them as coming back and chose fewer victims for them
        # (docs/decisions/714, 716, 819).
        # Equalities, not IN: the raw driver runs statements compiled once, without
        # expanding parameters.
        .where(sa.or_(*(request.c.state == state for state in COMING_BACK)))
    )


def _holders(rows: Sequence[Any]) -> list[Candidate]:
    return [Candidate(row[0], row[1], json.loads(row[2])) for row in rows]


def holders(connection: sa.Connection, now: float) -> list[Candidate]:
    """Waiting preemptors with a live hold, oldest hold first."""
    return _holders(connection.execute(_holders_query(), {"now": now}).all())


def read_guard(transaction: DriverTransaction | sa.Connection, now: float) -> HeldRoom | None:
    """Admission's guard over held room (the dry run's too), or None when no hold is live."""
    def rows(statement: sa.Select[Any], parameters: dict[str, Any]) -> Sequence[Any]:
        if isinstance(transaction, sa.Connection):
            return transaction.execute(statement, parameters).all()
        return transaction.rows(statement, parameters)

    held = _holders(rows(_holders_query(), {"now": now}))
    if not held:
        return None
    stopping = [Running(row[0], row[1], row[2], json.loads(row[3]), int(row[4]),
                        float(row[5]), stopping=True)
                for row in rows(_stopping_query(), {})]
    return HeldRoom(held, stopping)


@lru_cache(maxsize=64)
def release_statement(count: int) -> sa.Delete:
    """Delete the holds of ``count`` admitted preemptors (``id_0`` …)."""
    return schema.hold.delete().where(
        schema.hold.c.request_id.in_([sa.bindparam(f"id_{i}") for i in range(count)]))


def hold(connection: sa.Connection, preemptor: str, tenant: str, now: float,
         seconds: float) -> None:
    """Hold what the preemption frees for ``preemptor`` (a newer hold replaces an older)."""
    connection.execute(schema.hold.delete().where(schema.hold.c.request_id == preemptor))
    connection.execute(schema.hold.insert().values(request_id=preemptor, tenant=tenant,
                                                   created=now, expires=now + seconds))


@lru_cache(maxsize=1)
def clean_statement() -> sa.Delete:
    """Delete holds that expired (by ``now``) or whose preemptor is no longer waiting."""
    held, request = schema.hold, schema.request
    waiting = sa.select(request.c.id).where(request.c.id == held.c.request_id,
                                            request.c.state == RequestState.WAITING.value)
    return held.delete().where(sa.or_(held.c.expires <= sa.bindparam("now", type_=sa.Double),
                                      ~waiting.exists()))


def clean(connection: sa.Connection, now: float) -> None:
    connection.execute(clean_statement(), {"now": now})
