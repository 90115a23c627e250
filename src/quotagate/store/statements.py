"""The admission hot path's statements, built once and reused with bound parameters.

Building a SQLAlchemy expression costs more CPU than sending it to a nearby
database (about 1.5 ms per admission when rebuilt every time, measured by
benchmarks/admit.py). Each statement here depends only on the *shape* of its
input (how many tenants, which resources, how many requests), so it is cached
by that shape and filled in with parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import RequestState
from quotagate.domain.placement import Placement
from quotagate.domain.sharing import UNBOUNDED
from quotagate.store import schema

_WAITING = RequestState.WAITING.value
# The qg_meta key of the ledger's fair-share half-life, seconds (docs/decisions/712).
HALF_LIFE_KEY = "fair_share_half_life"


@lru_cache(maxsize=1)
def usage_query() -> sa.CompoundSelect[Any]:
    """Tenant and pool usage in one round trip."""
    quota, capacity = schema.tenant_quota, schema.pool_capacity
    return sa.union_all(
        sa.select(sa.literal("t").label("kind"), quota.c.tenant.label("holder"), quota.c.resource,
                  quota.c.used, quota.c.cap),
        sa.select(sa.literal("p").label("kind"), *summed_pool_columns()[:4])
        .group_by(capacity.c.pool, capacity.c.resource),
    )


def summed_pool_columns() -> tuple[Any, ...]:
    """``pool, resource, used, cap, slices`` of a pool resource, summed over its slices.

    For a SELECT from ``qg_pool_capacity`` grouped by pool and resource: what
    every reader of a pool's use shows (docs/decisions/029-capacity-slices.md).
    The sums are cast back to BIGINT; SUM of a BIGINT is a DECIMAL otherwise.
    """
    capacity = schema.pool_capacity
    return (capacity.c.pool, capacity.c.resource,
            sa.cast(sa.func.sum(capacity.c.used), sa.BigInteger).label("used"),
            sa.cast(sa.func.sum(capacity.c.cap), sa.BigInteger).label("cap"),
            sa.cast(sa.func.count(), sa.BigInteger).label("slices"))


@lru_cache(maxsize=256)
def head_query(tenant_count: int, window: int) -> sa.Select[Any] | sa.CompoundSelect[Any]:
    """The first ``window`` waiting requests of each of ``tenant_count`` tenants.

    One bounded index range scan per tenant; parameters ``tenant_0`` … ``tenant_N``.
    The window is written into the SQL, not bound: PostgreSQL judges a prepared
    statement's generic plan with a bound LIMIT as reading a tenth of each queue,
    and with long queues planned all N scans again at every admission instead
    (docs/decisions/035-head-read-window-literal.md).
    """
    heads = [head.subquery(f"head_{index}")
             for index, head in enumerate(_head_reads(tenant_count, window))]
    if len(heads) == 1:
        return sa.select(heads[0])
    return sa.union_all(*(sa.select(head) for head in heads))


def _head_reads(tenant_count: int, window: int) -> list[sa.Select[Any]]:
    """Each tenant's bounded head read (``tenant_i``), in queue order, with :func:`head_query`'s columns."""
    request = schema.request
    limit: sa.ColumnElement[int] = sa.literal_column(str(int(window)))
    return [
        sa.select(
            request.c.id, request.c.tenant, request.c.cost, request.c.queue_key,
            request.c.created, request.c.target, request.c.reserved_runtime,
            request.c.token_floor,
        )
        .where(request.c.tenant == sa.bindparam(f"tenant_{index}"), request.c.state == _WAITING)
        .order_by(request.c.queue_key, request.c.created, request.c.id)
        .limit(limit)
        for index in range(tenant_count)
    ]


@lru_cache(maxsize=256)
def ordered_head_query(tenant_count: int, window: int, collation: str | None, *,
                       flat: bool = False) -> sa.Select[Any]:
    """:func:`head_query` merged into queue order by the database, without the order's columns.

    ``id, tenant, cost, target, reserved_runtime, token_floor``, ordered by
    ``queue_key, created, id``: the client neither fetches the two floats
    (about a third of psycopg's fetch of a head read) nor sorts. Ties on the
    id are broken by code point, as Python sorts strings: ``collation`` names
    the database's byte-order collation where the column's own may differ
    (:func:`quotagate.store.dialect.code_point_collation`).

    ``flat``: the tenants' reads are the UNION's own members, each in
    parentheses with its ORDER BY and LIMIT, instead of a derived table each
    (:func:`quotagate.store.dialect.materializes_derived_tables`: MariaDB fills a
    temporary table per derived table; docs/decisions/054-flat-head-read-on-mariadb.md).
    SQLite parses no parenthesized member.
    """
    if flat and tenant_count == 1:  # one read, in queue order already: no derived table at all
        request = schema.request
        (read,) = _head_reads(1, window)
        return read.with_only_columns(
            request.c.id, request.c.tenant, request.c.cost, request.c.target,
            request.c.reserved_runtime, request.c.token_floor,
        ).order_by(None).order_by(request.c.queue_key, request.c.created,
                                  _by_code_point(request.c.id, collation))
    if flat:
        heads = sa.union_all(*_head_reads(tenant_count, window)).subquery("heads")
    else:
        heads = head_query(tenant_count, window).subquery("heads")
    return (
        sa.select(heads.c.id, heads.c.tenant, heads.c.cost, heads.c.target,
                  heads.c.reserved_runtime, heads.c.token_floor)
        .order_by(heads.c.queue_key, heads.c.created, _by_code_point(heads.c.id, collation))
    )


def _by_code_point(column: sa.ColumnElement[Any], collation: str | None) -> sa.ColumnElement[Any]:
    return column if collation is None else sa.collate(column, collation)


def head_parameters(tenants: Sequence[str]) -> dict[str, str]:
    """The values of :func:`head_query`'s ``tenant_i`` parameters."""
    return dict(zip(_names("tenant", len(tenants)), tenants, strict=True))


@lru_cache(maxsize=512)
def _names(prefix: str, count: int) -> tuple[str, ...]:
    """``prefix_0`` … ``prefix_{count-1}``: formatted once, not at every admission."""
    return tuple(f"{prefix}_{index}" for index in range(count))


@lru_cache(maxsize=64)
def lock_waiting_query(count: int) -> sa.Select[Any]:
    """Lock ``count`` waiting requests (``id_0`` …), skipping those another transaction holds."""
    request = schema.request
    return (
        sa.select(request.c.id)
        .where(request.c.id.in_([sa.bindparam(f"id_{i}") for i in range(count)]),
               request.c.state == _WAITING)
        .order_by(request.c.id)
        .with_for_update(skip_locked=True)
    )


@lru_cache(maxsize=64)
def count_locked_waiting_query(count: int) -> sa.Select[Any]:
    """:func:`lock_waiting_query` answering only how many it locked: one number, no rows.

    For a lock whose count the server checks itself, inside MariaDB's batched
    writes (``DriverTransaction.expect_count``); it never waits either.
    """
    request = schema.request
    return (
        sa.select(sa.func.count())
        .select_from(request)
        .where(request.c.id.in_([sa.bindparam(f"id_{i}") for i in range(count)]),
               request.c.state == _WAITING)
        .with_for_update(skip_locked=True)
    )


@lru_cache(maxsize=128)
def reserve_statement(count: int) -> sa.Update:
    """Set ``count`` waiting requests reserved, each with its pool (``id_i`` → ``pool_i``).

    The caller has locked the rows already (MySQL/MariaDB, whose UPDATE can
    neither read its own table in a subquery nor return rows) or holds the
    database write lock (SQLite), and checks the row count; PostgreSQL's
    statement is :func:`reserve_and_record_statement`. The ids are ``id_0`` …
    as plain parameters, not an expanding IN: a cached statement needs no
    per-call rewriting.
    """
    return _reserve_update(count)


def _reserve_update(count: int) -> sa.Update:
    """The reserving UPDATE of ``count`` requests its caller has locked (or holds the
    write lock of)."""
    request = schema.request
    ids: list[sa.BindParameter[Any]] = [sa.bindparam(f"id_{i}") for i in range(count)]
    # One request (admit(1)) needs no CASE to pick its pool: SQLite spent a tenth of
    # the statement evaluating it.
    pool_of: Any = sa.bindparam("pool_0") if count == 1 else sa.case(
        *((request.c.id == ids[i], sa.bindparam(f"pool_{i}")) for i in range(count)))
    return (
        request.update()
        .where(request.c.id.in_(ids), request.c.state == _WAITING)
        .values(state=RequestState.RESERVED.value, pool=pool_of, updated=sa.bindparam("now"),
                admitted=sa.bindparam("now"))
    )


@lru_cache(maxsize=1)
def reserve_and_record_statement() -> sa.TextClause:
    """PostgreSQL: lock and reserve the planned requests (``:ids``, each with its pool in
    ``:pools``), skipping those another admitter holds, and write the outbox row and the
    audit entry of every request reserved, in one statement; returns the ids reserved.

    The two INSERTs read the UPDATE's RETURNING rows in data-modifying CTEs, so an
    admission batch costs one round trip and one statement fewer than reserving
    and recording apart (docs/decisions/050-reserve-and-record-in-one-statement.md).
    Only reserved requests get records: one another admitter held is skipped by
    the lock and so by the UPDATE and both INSERTs. The entries are written in plan
    order (the order of ``:ids``), as the placements are. Parameters: ``ids``,
    ``pools`` (lists, as :func:`reserve_arrays`), ``now``, ``actor``.

    Every row is found by its primary key, one lookup per planned id, whatever
    the statistics say (docs/decisions/250): each id's lock is a LATERAL
    subquery on ``id = w.id`` (a one-row equality on the primary key), run once
    (MATERIALIZED); the lock reads the row's state (under READ COMMITTED its
    latest committed version), and the UPDATE reserves the locked rows that
    are waiting, joined by id, with no condition on its own ``state``. A
    condition on ``state`` next to the id list let PostgreSQL take the state
    index, estimated at one row on a queue its statistics did not know yet (a
    burst into a fresh table, before autovacuum analyzes it), and filter the
    whole waiting queue there once for the UPDATE and once more per chosen
    row for the locking subquery: 8-67 ms per batch of 16-64 on a queue of
    5,000, and 36-527 ms with the generic plan of the prepared statement.
    One statement text for every batch size: one prepared statement, and no
    CASE of one branch per request to plan.
    """
    request, outbox, audit = schema.request.name, schema.outbox.name, schema.audit.name
    reserved, waiting = RequestState.RESERVED.value, _WAITING  # constants, written in
    return sa.text(
        "WITH locked AS MATERIALIZED (SELECT w.rank, w.pool, held.id, held.state"
        " FROM unnest(CAST(:ids AS TEXT[]), CAST(:pools AS TEXT[])) WITH ORDINALITY"
        " AS w(id, pool, rank)"
        f" CROSS JOIN LATERAL (SELECT id, state FROM {request} WHERE id = w.id"
        " FOR UPDATE SKIP LOCKED) AS held),"
        f" reserved AS (UPDATE {request} SET state = '{reserved}', pool = locked.pool,"
        " updated = :now, admitted = :now"
        f" FROM locked WHERE {request}.id = locked.id AND locked.state = '{waiting}'"
        f" RETURNING {request}.id, {request}.tenant, {request}.target, {request}.pool,"
        " locked.rank),"
        f" outbox_rows AS (INSERT INTO {outbox} (request_id, tenant, target, created, attempts,"
        " next_attempt_at, delivered)"
        " SELECT id, tenant, target, :now, 0, :now, false FROM reserved ORDER BY rank),"
        f" audit_rows AS (INSERT INTO {audit} (at, actor, tenant, operation, target, outcome,"
        " reason)"
        f" SELECT :now, :actor, tenant, 'admit', id, '{reserved}', 'pool=' || pool"
        " FROM reserved ORDER BY rank)"
        " SELECT id FROM reserved"
    ).bindparams(sa.bindparam("now", type_=sa.Double), sa.bindparam("actor", type_=sa.String))


def reserve_arrays(plan: Sequence[Placement], now: float, actor: str) -> dict[str, Any]:
    """The parameters of :func:`reserve_and_record_statement` for planned placements."""
    return {"ids": [placement.id for placement in plan],
            "pools": [placement.pool for placement in plan], "now": now, "actor": actor}


def reserve_parameters(plan: Sequence[Placement], now: float) -> dict[str, Any]:
    """The parameters of :func:`reserve_statement` for planned placements."""
    count = len(plan)
    if count == 1:  # admit(1): one dict literal
        (only,) = plan
        return {"now": now, "id_0": only.id, "pool_0": only.pool}
    parameters: dict[str, Any] = {"now": now}
    parameters.update(zip(_names("id", count), [placement.id for placement in plan], strict=True))
    parameters.update(zip(_names("pool", count), [placement.pool for placement in plan],
                          strict=True))
    return parameters


@lru_cache(maxsize=256)
def charge_statement(
    table: sa.Table, holder_column: str, count: int, *, lock_in_order: bool = False,
    charge: bool = True, sliced: bool = False,
) -> sa.Update:
    """Charge ``count`` (holder, resource) rows of one table in one conditional UPDATE.

    With ``charge=False`` it returns the amounts instead, only where ``used >=
    amount`` (a batch of releases, :mod:`quotagate.store.release`), with the
    same lock order.

    Parameters ``holder_i``, ``resource_i``, ``amount_i``, given in (holder,
    resource) order. Each row is only charged where ``used + amount <= cap``;
    the caller checks that ``count`` rows changed, else the whole transaction
    rolls back. One statement per table, whatever the batch: a batch over four
    tenants and three pools costs two round trips, not seven.

    Concurrent admitters must take these row locks in one order, or they
    deadlock (and PostgreSQL only notices after ``deadlock_timeout``, a second).
    MySQL's InnoDB walks the primary key ranges in key order and SQLite has one
    writer; PostgreSQL's UPDATE locks in whatever order its plan visits rows, so
    with ``lock_in_order`` the rows are first locked by a sorted ``SELECT … FOR
    UPDATE`` in the same statement.

    With ``sliced`` (pool rows) each row is also named by its slice,
    ``slice_i``, and rows are locked in (pool, slice, resource) order.
    """
    return _charge_rows(table, holder_column, count, table.c.cap, lock_in_order=lock_in_order,
                        charge=charge, sliced=sliced)


def charge_parameters(amounts: dict[tuple[str, str], int]) -> dict[str, Any]:
    """The parameters of :func:`charge_statement` for ``{(holder, resource): amount}``."""
    parameters: dict[str, Any] = {}
    count = len(amounts)
    holders, resources, charges = _names("holder", count), _names("resource", count), \
        _names("amount", count)
    for index, ((holder, resource), amount) in enumerate(sorted(amounts.items())):
        parameters[holders[index]] = holder
        parameters[resources[index]] = resource
        parameters[charges[index]] = amount
    return parameters


@lru_cache(maxsize=16)
def charge_row_statement(table: sa.Table, holder_column: str, *, sliced: bool = False) -> sa.Update:
    """:func:`charge_statement` for one row (``holder_0``, ``resource_0``, ``amount_0``,
    ``slice_0`` with ``sliced``), run once per row where that is cheaper
    (:func:`quotagate.store.dialect.charges_row_by_row`, SQLite): no CASE to
    evaluate, one primary-key lookup. The caller checks that every row changed."""
    holder, amount = table.c[holder_column], sa.bindparam("amount_0", type_=sa.BigInteger)
    statement = table.update().where(
        holder == sa.bindparam("holder_0"), table.c.resource == sa.bindparam("resource_0"),
        *((table.c.slice == sa.bindparam("slice_0"),) if sliced else ()),
        table.c.used + amount <= table.c.cap,
    )
    return statement.values(used=table.c.used + amount)


def charge_row_parameters(amounts: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """The parameters of :func:`charge_row_statement`, one set per row, in (holder,
    resource) order: the lock order of :func:`charge_statement`."""
    return [{"holder_0": holder, "resource_0": resource, "amount_0": amount}
            for (holder, resource), amount in sorted(amounts.items())]


def sliced_charge_row_parameters(
    amounts: dict[tuple[str, int, str], int],
) -> list[dict[str, Any]]:
    """:func:`charge_row_parameters` of a ``sliced`` :func:`charge_row_statement`."""
    return [{"holder_0": holder, "slice_0": slice_number, "resource_0": resource,
             "amount_0": amount}
            for (holder, slice_number, resource), amount in sorted(amounts.items())]


def sliced_charge_parameters(amounts: dict[tuple[str, int, str], int]) -> dict[str, Any]:
    """The parameters of a ``sliced`` :func:`charge_statement`: ``{(pool, slice, resource): amount}``."""
    parameters: dict[str, Any] = {}
    count = len(amounts)
    holders, slices, resources, charges = (_names("holder", count), _names("slice", count),
                                           _names("resource", count), _names("amount", count))
    for index, ((holder, slice_number, resource), amount) in enumerate(sorted(amounts.items())):
        parameters[holders[index]] = holder
        parameters[slices[index]] = slice_number
        parameters[resources[index]] = resource
        parameters[charges[index]] = amount
    return parameters


@lru_cache(maxsize=1)
def outbox_insert() -> sa.Insert:
    """One admission's outbox row (``request_id``, ``tenant``, ``target``, ``now``)."""
    now = sa.bindparam("now", type_=sa.Double)
    return schema.outbox.insert().values(
        request_id=sa.bindparam("request_id"), tenant=sa.bindparam("tenant"),
        target=sa.bindparam("target"), created=now, attempts=0, next_attempt_at=now,
        delivered=sa.false(),
    )


def outbox_row(placement: Placement, target: str | None, now: float) -> dict[str, Any]:
    """The parameters of :func:`outbox_insert` for an admitted request."""
    return {"request_id": placement.id, "tenant": placement.tenant, "target": target, "now": now}


@lru_cache(maxsize=1)
def carry_token_statement() -> sa.Update:
    """A requeued request's new outbox row counts its claims on from ``token``, the last
    fencing token of its stopped attempt (``request_id``; docs/decisions/720)."""
    outbox = schema.outbox
    return (outbox.update().where(outbox.c.request_id == sa.bindparam("request_id"))
            .values(claim_token=sa.bindparam("token", type_=sa.BigInteger)))


@lru_cache(maxsize=1)
def admission_audit_insert() -> sa.Insert:
    """One admission's audit entry (``at``, ``actor``, ``tenant``, ``target``, ``reason``)."""
    return schema.audit.insert().values(
        at=sa.bindparam("at", type_=sa.Double), actor=sa.bindparam("actor"),
        tenant=sa.bindparam("tenant"), operation="admit", target=sa.bindparam("target"),
        outcome="reserved", reason=sa.bindparam("reason"),
    )


def admission_audit_row(placement: Placement, now: float, actor: str) -> dict[str, Any]:
    """The parameters of :func:`admission_audit_insert` for an admitted request."""
    return {"at": now, "actor": actor, "tenant": placement.tenant, "target": placement.id,
            "reason": f"pool={placement.pool}"}


@lru_cache(maxsize=256)
def adjust_statement(table: sa.Table, holder_column: str, resources: tuple[str, ...],
                     charge: bool, *, returning: bool = False) -> sa.Update:
    """Charge or return amounts on one holder's rows (``holder``, ``amount_i`` per resource).

    A charge only applies where ``used + amount <= cap`` and a return only
    where ``used >= amount``; the caller checks that one row per resource changed.
    With ``returning`` (tenant rows, where UPDATE returns rows) the changed rows
    come back with their limits and root cohort (quotagate.store.cohorts).
    """
    amount = sa.case(
        *((table.c.resource == resource, sa.bindparam(f"amount_{i}", type_=sa.BigInteger))
          for i, resource in enumerate(resources)),
    )
    condition = table.c.used + amount <= table.c.cap if charge else table.c.used >= amount
    statement = (
        table.update()
        .where(table.c[holder_column] == sa.bindparam("holder"),
               table.c.resource.in_(resources), condition)
        .values(used=table.c.used + amount if charge else table.c.used - amount)
    )
    if returning:
        return statement.returning(*(table.c[name] for name in _MEMBER_COLUMNS))
    return statement


@lru_cache(maxsize=16)
@lru_cache(maxsize=64)
def submission_facts_query(with_target: bool, resources: int | None = None
                           ) -> sa.CompoundSelect[Any]:
    """Everything submit must know before it writes, in one round trip.

    Rows ``(fact, value)``: ``request`` if the id exists, ``tenant`` if the
    tenant exists, ``target`` if the named target exists and serves the tenant,
    ``default_closed`` if no target is named and the default target serves only
    other tenants, ``bucket`` if the tenant has a rate quota, ``max_priority``
    (as text) if the tenant has a maximum priority, ``default_max_runtime``
    (as text) if it has a default max-runtime, one ``ceiling`` per cost resource the
    tenant has a quota for (``resource:amount:cap:lending:room:root``, the most it could
    ever hold: its cap, a cohort member's nominal plus borrowing limit, empty for a member
    free to borrow as far as its cohort has room; for a member also its lending limit,
    its root cohort and that room's cap, which bound it too), one ``pool_cap`` per pool and cost resource
    it offers (``pool:resource:capacity``, its slices summed: the cost resources some
    pool offers are those named here). Parameters: ``id``,
    ``tenant``, ``resources`` (a list), ``target``; with ``resources`` given, that
    many ``resource_i`` instead of the list, for the driver cursor (which takes no
    expanding list: :func:`submission_facts_parameters`).
    """
    request, capacity, quota = schema.request, schema.pool_capacity, schema.tenant_quota
    offered = _among_cost_resources(capacity.c.resource, resources)
    parts = [
        sa.select(sa.literal("request").label("fact"), request.c.id.label("value"))
        .where(request.c.id == sa.bindparam("id")),
        sa.select(sa.literal("tenant").label("fact"), schema.tenant.c.name.label("value"))
        .where(schema.tenant.c.name == sa.bindparam("tenant")),
        sa.select(sa.literal("bucket").label("fact"), schema.rate_bucket.c.key.label("value"))
        .where(schema.rate_bucket.c.key == sa.bindparam("tenant")),
        sa.select(sa.literal("max_priority").label("fact"),
                  sa.cast(schema.tenant.c.max_priority, sa.String(16)).label("value"))
        .where(schema.tenant.c.name == sa.bindparam("tenant"),
               schema.tenant.c.max_priority.is_not(None)),
        sa.select(sa.literal("default_max_runtime").label("fact"),
                  sa.cast(schema.tenant.c.default_max_runtime, sa.String(16)).label("value"))
        .where(schema.tenant.c.name == sa.bindparam("tenant"),
               schema.tenant.c.default_max_runtime.is_not(None)),
        _ceilings(_among_cost_resources(quota.c.resource, resources)),
        sa.select(sa.literal("pool_cap").label("fact"),
                  (capacity.c.pool + _COLON + capacity.c.resource + _COLON
                   + sa.cast(sa.func.sum(capacity.c.cap), sa.String(24))).label("value"))
        .where(offered)
        .group_by(capacity.c.pool, capacity.c.resource),
    ]
    target, allowed = schema.delivery_target, schema.target_tenant
    limited = sa.exists().where(allowed.c.target == target.c.name)
    admitted = sa.exists().where(allowed.c.target == target.c.name,
                                 allowed.c.tenant == sa.bindparam("tenant"))
    if with_target:
        # A target limited to other tenants is, to this tenant, a target that
        # does not exist (docs/decisions/311-target-tenants.md).
        parts.append(
            sa.select(sa.literal("target").label("fact"), target.c.name.label("value"))
            .where(target.c.name == sa.bindparam("target"), sa.or_(~limited, admitted))
        )
    else:
        parts.append(
            sa.select(sa.literal("default_closed").label("fact"), target.c.name.label("value"))
            .where(target.c.is_default == sa.true(), limited, ~admitted)
        )
    return sa.union_all(*parts)


def _among_cost_resources(column: sa.ColumnElement[str], resources: int | None
                          ) -> sa.ColumnElement[bool]:
    """``column IN`` the submission's cost resources: the expanding ``resources`` list, or
    with ``resources`` given that many ``resource_i`` (the driver cursor's form)."""
    if resources is None:
        return column.in_(sa.bindparam("resources", expanding=True))
    return column.in_([sa.bindparam(name) for name in _names("resource", resources)])


# Written into the SQL: a bound ":" would be named after its column and clash with the
# resource parameters of the driver-cursor form.
_COLON = sa.literal_column("':'", sa.String)


def _ceilings(resource_listed: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The ``ceiling`` rows of :func:`submission_facts_query` (docs/decisions/809, 824)."""
    quota, room = schema.tenant_quota, schema.cohort_usage
    ceiling = sa.case(
        (quota.c.cohort_root.is_(None), quota.c.cap),
        (quota.c.borrowing_limit.is_not(None), quota.c.cap + quota.c.borrowing_limit),
        else_=sa.null(),
    )

    def text(value: Any) -> sa.ColumnElement[str]:
        return sa.func.coalesce(sa.cast(value, sa.String(24)), "")

    # The cap too, so that a member's refusal can say what its ceiling is made of; and
    # for a member its lending limit, its root cohort and that room's cap (no row: a room
    # of 0), since it can never hold more than its guaranteed part plus the whole room.
    room_cap = sa.case((quota.c.cohort_root.is_(None), sa.null()),
                       else_=sa.func.coalesce(room.c.cap, 0))
    return (
        sa.select(sa.literal("ceiling").label("fact"),
                  (quota.c.resource + _COLON + text(ceiling) + _COLON
                   + sa.cast(quota.c.cap, sa.String(24)) + _COLON
                   + text(quota.c.lending_limit) + _COLON + text(room_cap) + _COLON
                   + sa.func.coalesce(quota.c.cohort_root, "")).label("value"))
        .select_from(quota.outerjoin(room, sa.and_(room.c.cohort == quota.c.cohort_root,
                                                   room.c.resource == quota.c.resource)))
        .where(quota.c.tenant == sa.bindparam("tenant"), resource_listed)
    )


def submission_facts_parameters(id_: str, tenant: str, resources: Sequence[str],
                                target: str | None) -> dict[str, Any]:
    """The parameters of :func:`submission_facts_query` with ``len(resources)`` given."""
    parameters: dict[str, Any] = {"id": id_, "tenant": tenant, "target": target}
    parameters.update(zip(_names("resource", len(resources)), resources, strict=True))
    return parameters


@lru_cache(maxsize=8)
def request_insert(columns: tuple[str, ...]) -> sa.Insert:
    """One new request row with these ``columns``, each its own parameter: the driver
    cursor binds exactly what it is given (a bare ``insert()`` names every column)."""
    request = schema.request
    return request.insert().values(
        {name: sa.bindparam(name, type_=request.c[name].type) for name in columns})


# -- cohorts (docs/fair-sharing.md) ------------------------------------------------


@lru_cache(maxsize=2)
def admission_snapshot_query(*, typed_nulls: bool = True) -> sa.CompoundSelect[Any]:
    """Everything admission plans on, in one round trip: :func:`usage_query` and cohorts.

    Rows ``(kind, holder, resource, used, cap, borrowing_limit, lending_limit,
    cohort_root, decayed, decayed_at)``: ``t`` tenant quota rows (with their
    limits, root cohort and decayed past use), ``p`` pool rows (one per
    capacity slice, its number in ``borrowing_limit``; :func:`quotagate.store.cohorts.snapshot_from_rows`
    sums them), ``c`` the shared
    room of each root cohort, ``w`` the weight (in ``used``) of each tenant
    whose weight is not 1, ``x`` the preemption policies (reclaim in
    ``resource``, within-tenant in ``cohort_root``) of each tenant that has
    one, ``g`` each budgeted (tenant, resource), whose state admission then
    reads (quotagate.store.budgets), ``h`` the fair-share half-life in
    ``used`` if one is set, ``i`` each preemptor whose freed room is held
    (quotagate.store.holds). Without cohorts, weights, policies, budgets, a
    half-life and holds the last six parts read nothing.

    Without ``typed_nulls`` the empty columns are bare NULLs
    (:func:`quotagate.store.dialect.types_union_columns_from_all_parts`: MariaDB):
    half as much SQL for the server to parse at every admission.
    """
    quota, capacity, shared = schema.tenant_quota, schema.pool_capacity, schema.cohort_usage
    tenant, budget, meta = schema.tenant, schema.tenant_budget, schema.ledger_meta
    none: Any = sa.cast(sa.null(), sa.BigInteger) if typed_nulls else sa.null()
    no_root: Any = sa.cast(sa.null(), schema.NAME) if typed_nulls else sa.null()
    no_resource: Any = sa.cast(sa.null(), schema.RESOURCE) if typed_nulls else sa.null()
    no_time: Any = sa.cast(sa.null(), schema.TIME) if typed_nulls else sa.null()
    return sa.union_all(
        sa.select(sa.literal("t").label("kind"), quota.c.tenant.label("holder"), quota.c.resource,
                  quota.c.used, quota.c.cap, quota.c.borrowing_limit, quota.c.lending_limit,
                  quota.c.cohort_root, quota.c.decayed, quota.c.decayed_at),
        # One row per slice, summed by the reader: SQLite's GROUP BY sorted in a
        # temporary b-tree and cost a fifth of this whole read.
        sa.select(sa.literal("p"), capacity.c.pool, capacity.c.resource, capacity.c.used,
                  capacity.c.cap, sa.cast(capacity.c.slice, sa.BigInteger), none, no_root,
                  no_time, no_time),
        sa.select(sa.literal("c"), shared.c.cohort, shared.c.resource, shared.c.used,
                  shared.c.cap, none, none, no_root, no_time, no_time),
        sa.select(sa.literal("w"), tenant.c.name, no_resource,
                  sa.cast(tenant.c.weight, sa.BigInteger), none, none, none, no_root, no_time,
                  no_time)
        .where(tenant.c.weight != 1),
        sa.select(sa.literal("x"), tenant.c.name, sa.cast(tenant.c.reclaim, schema.RESOURCE),
                  none, none, none, none, sa.cast(tenant.c.within_tenant, schema.NAME), no_time,
                  no_time)
        .where(sa.or_(tenant.c.reclaim != "never", tenant.c.within_tenant != "never")),
        sa.select(sa.literal("g"), budget.c.tenant, budget.c.resource, none, none, none, none,
                  no_root, no_time, no_time),
        sa.select(sa.literal("h"), sa.cast(meta.c.key, schema.NAME), no_resource,
                  sa.cast(meta.c.value, sa.BigInteger), none, none, none, no_root, no_time,
                  no_time)
        .where(meta.c.key == HALF_LIFE_KEY),
        sa.select(sa.literal("i"), schema.hold.c.request_id, no_resource, none, none, none,
                  none, no_root, no_time, no_time),
    )


_MEMBER_COLUMNS = ("tenant", "resource", "used", "cap", "borrowing_limit", "lending_limit",
                   "cohort_root")


@lru_cache(maxsize=64)
def lock_members_query(tenant_count: int) -> sa.Select[Any]:
    """Lock the quota rows of ``tenant_count`` tenants (``tenant_0`` …) and read them.

    Rows ``(tenant, resource, used, cap, borrowing_limit, lending_limit,
    cohort_root)`` in (tenant, resource) order. Under these locks the values
    are exact, so the change of the cohort room each charge makes is too.
    """
    quota = schema.tenant_quota
    return (
        sa.select(*(quota.c[name] for name in _MEMBER_COLUMNS))
        .where(quota.c.tenant.in_([sa.bindparam(f"tenant_{i}") for i in range(tenant_count)]))
        .order_by(quota.c.tenant, quota.c.resource)
        .with_for_update()
    )


@lru_cache(maxsize=256)
def borrowing_charge_statement(
    count: int, *, lock_in_order: bool = False, returning: bool = False
) -> sa.Update:
    """:func:`charge_statement` on members' rows, up to nominal plus borrowing limit.

    ``cap`` is a member's nominal; a NULL borrowing limit is bounded by the
    cohort's room only (charged separately), so here by ``UNBOUNDED``. With
    ``returning`` (PostgreSQL, SQLite) the charged rows come back as in
    :func:`lock_members_query`, ``used`` after the charge: what the room's
    change is computed from, without a locking read first.
    """
    quota = schema.tenant_quota
    ceiling = quota.c.cap + sa.func.coalesce(
        quota.c.borrowing_limit, sa.cast(sa.literal(UNBOUNDED), sa.BigInteger))
    statement = _charge_rows(quota, "tenant", count, ceiling, lock_in_order=lock_in_order)
    if returning:
        return statement.returning(*(quota.c[name] for name in _MEMBER_COLUMNS))
    return statement


def _charge_rows(
    table: sa.Table, holder_column: str, count: int, ceiling: Any, *, lock_in_order: bool,
    charge: bool = True, sliced: bool = False,
) -> sa.Update:
    holder, resource = table.c[holder_column], table.c.resource
    rows = [
        sa.and_(holder == sa.bindparam(f"holder_{i}"), resource == sa.bindparam(f"resource_{i}"),
                *((table.c.slice == sa.bindparam(f"slice_{i}"),) if sliced else ()))
        for i in range(count)
    ]
    amount = sa.case(
        *((row, sa.bindparam(f"amount_{i}", type_=sa.BigInteger)) for i, row in enumerate(rows))
    )
    condition = table.c.used + amount <= ceiling if charge else table.c.used >= amount
    statement = table.update().where(condition)
    if lock_in_order:
        if sliced:
            locked = (
                sa.select(holder.label("holder"), table.c.slice.label("slice"),
                          resource.label("resource"))
                .where(sa.or_(*rows))
                .order_by(holder, table.c.slice, resource)
                .with_for_update()
                .subquery("locked")
            )
            statement = statement.where(holder == locked.c.holder, resource == locked.c.resource,
                                        table.c.slice == locked.c.slice)
        else:
            locked = (
                sa.select(holder.label("holder"), resource.label("resource"))
                .where(sa.or_(*rows))
                .order_by(holder, resource)
                .with_for_update()
                .subquery("locked")
            )
            statement = statement.where(holder == locked.c.holder,
                                        resource == locked.c.resource)
    else:
        statement = statement.where(sa.or_(*rows))
    return statement.values(used=table.c.used + amount if charge else table.c.used - amount)
