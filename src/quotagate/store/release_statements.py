"""The statements of the release path, built once (per batch size) for the driver connection.

A release ran its statements as SQLAlchemy Core expressions built at every
call: building them, their cache keys and ``Connection.execute`` were most of
a confirmed stop's CPU (docs/decisions/246). These are the same statements,
with bound parameters instead of values, cached here so that
:mod:`quotagate.store.driver` compiles each once per dialect.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.store import identity, schema

__all__ = ["REQUEST_COLUMNS", "begin_stop_statement", "delivery_begun_query", "id_binds", "id_parameters",
           "lock_decisions_query",
           "lock_requests_query", "mark_stop_statement", "move_statement",
           "outbox_delete_statement", "state_is"]

# The request row as the release reads it: every column, in this order.
REQUEST_COLUMNS: tuple[str, ...] = tuple(column.name for column in schema.request.columns)
# What a state move returns (UPDATE … RETURNING): what the moved row gives back,
# then whether its tenant is a cohort member (:func:`move_statement`).
_MOVED = ("id", "tenant", "pool", "pool_slice", "cost")


def id_binds(count: int) -> list[Any]:
    """``id_0`` … ``id_{count-1}``: a batch's ids as plain parameters, not an expanding IN,
    so that a cached statement needs no per-call rewriting."""
    return [sa.bindparam(f"id_{index}") for index in range(count)]


def id_parameters(ids: Sequence[str]) -> dict[str, str]:
    """The ``id_i`` parameters (:func:`id_binds`) of ``ids``, in order."""
    return {f"id_{index}": request_id for index, request_id in enumerate(ids)}


@lru_cache(maxsize=64)
def lock_requests_query(count: int) -> sa.Select[Any]:
    """Lock ``count`` request rows (``id_0`` …) in id order and read them whole."""
    request = schema.request
    return (sa.select(*(request.c[name] for name in REQUEST_COLUMNS))
            .where(request.c.id.in_(id_binds(count))).order_by(request.c.id).with_for_update())


def state_is(state: Any) -> sa.ColumnElement[bool]:
    """``qg_request.state = state`` for rows a statement finds by id and has locked already.

    Written on an expression, not on the bare column, so no planner takes the
    ``(state, created)`` index for it: on a table its statistics do not know yet (a
    burst, before autovacuum analyzes it) PostgreSQL did, and filtered every row in
    that state — all running work — to find a few ids (docs/decisions/256). The
    test only confirms what the lock read; the ids find the rows.
    """
    confirmed: sa.ColumnElement[bool] = sa.func.coalesce(schema.request.c.state, "") == state
    return confirmed


# Cached like the other statements here: each new object would be compiled afresh
# by the driver's per-statement cache, on every group release.
@lru_cache(maxsize=256)
def move_statement(count: int, returning: bool) -> sa.Update:
    """Move ``count`` rows (``id_i``) that are ``current`` to ``to_state`` (``now``, ``reason``).

    With ``returning`` the moved rows come back with what they give back and
    whether their tenant is a cohort member: the cost return needs to know that
    for its lock order (:mod:`quotagate.store.returns`), and read it in a round
    trip of its own (docs/decisions/248). Like that read, the subquery takes no lock.
    """
    request, quota = schema.request, schema.tenant_quota
    statement = (
        request.update()
        .where(request.c.id.in_(id_binds(count)), state_is(sa.bindparam("current")))
        .values(state=sa.bindparam("to_state"), updated=sa.bindparam("now", type_=sa.Double),
                reason=sa.bindparam("reason"))
    )
    if returning:
        member = sa.exists().where(quota.c.tenant == request.c.tenant,
                                   quota.c.cohort_root.is_not(None))
        return statement.returning(*(request.c[name] for name in _MOVED), member)
    return statement


@lru_cache(maxsize=1)
def begin_stop_statement() -> sa.Update:
    """One ``current`` request (``id``), locked and read by the release, to its stopping
    state ``to_state`` (``cancelling``, ``completing``, ``failing``; ``now``, ``reason``).
    Its state is only confirmed (:func:`state_is`): on a never-analyzed table of 3,000
    reserved requests PostgreSQL found the row through the state index and filtered every
    reserved row (docs/decisions/254)."""
    request = schema.request
    return (
        request.update()
        .where(request.c.id == sa.bindparam("id"), state_is(sa.bindparam("current")))
        .values(state=sa.bindparam("to_state"),
                updated=sa.bindparam("now", type_=sa.Double), reason=sa.bindparam("reason"))
    )


@lru_cache(maxsize=1)
def delivery_begun_query() -> sa.Select[Any]:
    """Has a worker taken up a reserved request's (``id``) delivery? Its outbox row, locked.

    Claimed now, or an attempt failed before (a lost reply may have created the
    object all the same): an executor may hold the work (docs/decisions/819). Locked
    under the request row (the lock order), so a worker's claim either came before
    and shows here or skips the row and then finds it gone.
    """
    outbox = schema.outbox
    return (sa.select(outbox.c.claimed_by.is_not(None) | (outbox.c.attempts > 0))
            .where(outbox.c.request_id == sa.bindparam("id")).with_for_update())


@lru_cache(maxsize=1)
def mark_stop_statement() -> sa.Update:
    """A request's (``stopped_id``) outbox row made a stop, due at once (release.mark_stop)."""
    outbox = schema.outbox
    return (
        outbox.update().where(outbox.c.request_id == sa.bindparam("stopped_id"))
        .values(stopping=True, attempts=0, last_error=sa.null(), stop_progress=sa.null(),
                claimed_by=sa.case((outbox.c.delivered == sa.true(), sa.null()),
                                   else_=outbox.c.claimed_by))
    )


@lru_cache(maxsize=64)
def outbox_delete_statement(count: int) -> sa.Delete:
    """The outbox rows of ``count`` ended requests (``id_i``): undelivered ones and stops."""
    outbox = schema.outbox
    return outbox.delete().where(
        outbox.c.request_id.in_(id_binds(count)),
        sa.or_(outbox.c.delivered == sa.false(), outbox.c.stopping == sa.true()),
    )


@lru_cache(maxsize=1)
def lock_decisions_query() -> sa.Select[Any]:
    """The ledger-wide lock of preemption decisions (the ledger's identity row)."""
    meta = schema.ledger_meta
    return (sa.select(meta.c.value).where(meta.c.key == identity.LEDGER_ID_KEY)
            .with_for_update())
