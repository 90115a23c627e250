"""Capacity slices of pools: which slice an admission charges, rebalancing, the S change.

A pool's cap per resource is split over S slices, rows ``(pool, slice,
resource)`` of ``qg_pool_capacity``; its cap and use are the sums
(docs/decisions/029-capacity-slices.md). Best fit chooses the *pool* from
the sums; this module chooses the *slice*, by best fit too (the one with the
least room that fits, docs/decisions/042-best-fit-slices.md) among those no
other admitter is charging right now (``FOR UPDATE SKIP LOCKED``), so
concurrent admitters charge different rows instead of queueing on one.
A pool with one slice is charged exactly as before slices existed, slice 0.

Each slice is claimed through the row of the pool's first resource (by name):
only its claimer charges a slice's other rows in an admission, so two
admitters never wait on each other inside one slice. A claim holds that one
row (InnoDB: locked by its key, :func:`_claim_by_key`). Every wait in an
admission is then in (pool, slice, resource) order, the order release and
configuration use, and skipped locks never wait: no deadlock
(docs/decisions/041-one-lock-order.md).

A batch whose cost fits the pool but no single slice raises
:class:`SliceFragmented`; the ledger rolls back, :func:`rebalance` moves room
into one slice in a transaction of its own (holding nothing else, so its
waits in slice order cannot close a cycle), and the admission runs again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.placement import Placement
from quotagate.domain.slices import MAX_SLICES, concentrate, spread
from quotagate.errors import Conflict, InvalidInput, quoted
from quotagate.store import schema, statements
from quotagate.store.charges import charge_rows
from quotagate.store.dialect import (
    locks_named_tables,
    locks_only_rows_returned,
    reserves_with_lock,
    supports_skip_locked,
)
from quotagate.store.driver import DriverTransaction

__all__ = ["SliceFragmented", "charge", "check", "configure", "rebalance", "validate_slices"]


class SliceFragmented(Exception):
    """A batch fits no slice of ``pool`` that could be had: rebalance, then admit again."""

    def __init__(self, pool: str, need: Mapping[str, int]) -> None:
        super().__init__(pool)
        self.pool = pool
        self.need = dict(need)


def validate_slices(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SLICES:
        raise InvalidInput(f"slices must be a whole number from 1 to {MAX_SLICES}",
                           code="invalid_slices")
    return count


def _fitting(others: int) -> sa.Select[Any]:
    """The slices of ``pool`` whose claim row and ``others`` more rows fit the batch,
    the one with the least room on the ``claim`` resource first (best fit).

    ``amount`` on the claim resource, ``amount_i`` on each of ``others`` more
    resources ``resource_i``. Best fit keeps the slice with the most room for
    the request that needs it: after a rebalance, the slice it filled is the
    one small batches go to last (docs/decisions/042-best-fit-slices.md).
    """
    capacity = schema.pool_capacity
    other = capacity.alias("other")
    fits = [
        sa.exists().where(
            other.c.pool == capacity.c.pool, other.c.slice == capacity.c.slice,
            other.c.resource == sa.bindparam(f"resource_{index}"),
            other.c.used + sa.bindparam(f"amount_{index}", type_=sa.BigInteger) <= other.c.cap)
        for index in range(others)
    ]
    return (
        sa.select(capacity.c.slice)
        .where(capacity.c.pool == sa.bindparam("pool"),
               capacity.c.resource == sa.bindparam("claim"),
               capacity.c.used + sa.bindparam("amount", type_=sa.BigInteger) <= capacity.c.cap,
               *fits)
    )


@lru_cache(maxsize=64)
def _claim_query(skip_locked: bool, others: int, lock_of: bool) -> sa.Select[Any]:
    """The best-fit slice of ``pool`` (:func:`_fitting`), its claim row locked.

    Only the claim row is locked; the others are read as they are, and the
    conditional charge after decides. Used where the engine locks only the row
    the LIMIT keeps (PostgreSQL; SQLite takes no row locks at all).
    """
    capacity = schema.pool_capacity
    return (
        _fitting(others)
        .order_by((capacity.c.cap - capacity.c.used), capacity.c.slice)
        .limit(1)
        .with_for_update(skip_locked=skip_locked, of=capacity if lock_of else None)
    )


@lru_cache(maxsize=64)
def _candidates_query(others: int) -> sa.Select[Any]:
    """:func:`_fitting` in best-fit order, read without a lock (InnoDB: see :func:`_claim`)."""
    capacity = schema.pool_capacity
    return _fitting(others).order_by((capacity.c.cap - capacity.c.used), capacity.c.slice)


@lru_cache(maxsize=64)
def _slice_claim_query(skip_locked: bool, others: int) -> sa.Select[Any]:
    """Lock slice ``slice``'s claim row by its key, if it still fits (InnoDB)."""
    capacity = schema.pool_capacity
    return (_fitting(others).where(capacity.c.slice == sa.bindparam("slice"))
            .with_for_update(skip_locked=skip_locked))


@lru_cache(maxsize=64)
def _record_statement(count: int) -> sa.Update:
    """Record the slice each of ``count`` requests was charged to (``id_i`` → ``slice_i``)."""
    request = schema.request
    ids: list[sa.BindParameter[Any]] = [sa.bindparam(f"id_{index}") for index in range(count)]
    slice_of = sa.case(*((request.c.id == ids[index], sa.bindparam(f"slice_{index}"))
                         for index in range(count)))
    return request.update().where(request.c.id.in_(ids)).values(pool_slice=slice_of)


def _claim_parameters(
    pool: str, claim: str, amounts: Mapping[str, int]
) -> tuple[list[str], dict[str, Any]]:
    """:func:`_claim_query`'s parameters: the claimed resource and the others, in order."""
    others = sorted(resource for resource in amounts if resource != claim)
    parameters: dict[str, Any] = {"pool": pool, "claim": claim, "amount": amounts.get(claim, 0)}
    for index, resource in enumerate(others):
        parameters[f"resource_{index}"] = resource
        parameters[f"amount_{index}"] = amounts[resource]
    return others, parameters


def _claim(
    transaction: DriverTransaction, pool: str, claim: str, amounts: Mapping[str, int]
) -> int | None:
    others, parameters = _claim_parameters(pool, claim, amounts)
    skip, lock_of = supports_skip_locked(transaction), locks_named_tables(transaction)
    if skip and not locks_only_rows_returned(transaction):
        return _claim_by_key(transaction, len(others), parameters)
    found = transaction.rows(_claim_query(skip, len(others), lock_of), parameters)
    if not found and skip:
        # Every slice with room is being charged by another admitter: wait for
        # one (in order, as nothing of a later pool is held yet).
        found = transaction.rows(_claim_query(False, len(others), lock_of), parameters)
    return int(found[0][0]) if found else None


def _claim_by_key(
    transaction: DriverTransaction, others: int, parameters: dict[str, Any]
) -> int | None:
    """InnoDB: choose from an unlocked read, then lock the one claim row by its key.

    InnoDB's locking read keeps every row its sort read locked, so the sorted
    claim held the claim row of every slice that fitted: an admitter charging
    one of them then waited on another slice's rows while holding later ones,
    against the (pool, slice, resource) order a release locks in. Here it holds
    one claim row. Skipping held slices first, then waiting for one in slice
    order, holding nothing else of the pool (a slice that no longer fits when
    its lock is granted does not stay locked: READ COMMITTED).
    """
    candidates = [int(row[0]) for row in transaction.rows(_candidates_query(others), parameters)]
    for skip, order in ((True, candidates), (False, sorted(candidates))):
        for number in order:
            if transaction.rows(_slice_claim_query(skip, others), {**parameters, "slice": number}):
                return number
    return None


@lru_cache(maxsize=64)
def _claim_and_charge_statement(others: int, count: int) -> sa.Update:
    """PostgreSQL: claim a slice as :func:`_claim_query` does and charge it, one round trip.

    The claim is a SKIP LOCKED sub-select; the slice's rows are then locked in
    resource order (as the lock order wants) and charged conditionally, with
    ``charge_resource_i`` / ``charge_amount_i`` for the ``count`` resources.
    Returns the charged rows' slice: ``count`` rows, or fewer when it missed.
    """
    capacity = schema.pool_capacity
    claimed = _claim_query(True, others, True).scalar_subquery()
    resources: list[sa.BindParameter[Any]] = [
        sa.bindparam(f"charge_resource_{index}") for index in range(count)]
    locked = (
        sa.select(capacity.c.slice, capacity.c.resource)
        .where(capacity.c.pool == sa.bindparam("pool"), capacity.c.slice == claimed,
               capacity.c.resource.in_(resources))
        .order_by(capacity.c.resource)
        .with_for_update()
        .subquery("locked")
    )
    amount = sa.case(*((capacity.c.resource == resources[index],
                        sa.bindparam(f"charge_amount_{index}", type_=sa.BigInteger))
                       for index in range(count)))
    return (
        capacity.update()
        .where(capacity.c.pool == sa.bindparam("pool"), capacity.c.slice == locked.c.slice,
               capacity.c.resource == locked.c.resource, capacity.c.used + amount <= capacity.c.cap)
        .values(used=capacity.c.used + amount)
        .returning(capacity.c.slice)
    )


def _claim_and_charge(
    transaction: DriverTransaction, pool: str, claim: str, amounts: Mapping[str, int]
) -> int | None:
    """The slice claimed and charged in one statement, or None if none could be had."""
    others, parameters = _claim_parameters(pool, claim, amounts)
    for index, (resource, amount) in enumerate(sorted(amounts.items())):
        parameters[f"charge_resource_{index}"] = resource
        parameters[f"charge_amount_{index}"] = amount
    rows = transaction.rows(_claim_and_charge_statement(len(others), len(amounts)), parameters)
    if not rows:
        return None
    if len(rows) != len(amounts):
        # A slice was claimed but one of its other resources had no room after all.
        raise SliceFragmented(pool, amounts)
    return int(rows[0][0])


def charge(
    transaction: DriverTransaction,
    placements: Sequence[Placement],
    slices: Mapping[str, int],
    pools: Mapping[str, Mapping[str, tuple[int, int]]],
    *,
    lock_in_order: bool,
    missed: Exception,
) -> None:
    """Charge the pools of ``placements``; ``missed`` is raised when a conditional charge
    missed (at once, or when the transaction's batched writes are sent:
    :meth:`~quotagate.store.driver.DriverTransaction.expect`).

    ``slices`` is the snapshot's slice count per pool (absent: one) and
    ``pools`` its pools' resources, the first of which claims a slice.
    Without a sliced pool in the batch this is the one conditional UPDATE of
    before; with one, each pool is charged in name order, a sliced pool on
    the slice it claimed, and the requests record their slice.
    """
    # Plain dicts: a Counter's missing key costs a Python call (its __missing__).
    per_pool: dict[str, dict[str, int]] = {}
    for placement in placements:
        amounts = per_pool.setdefault(placement.pool, {})
        for resource, amount in placement.cost.items():
            amounts[resource] = amounts.get(resource, 0) + amount
    if not any(pool in slices for pool in per_pool):
        charge_rows(transaction, schema.pool_capacity, "pool", {
            (pool, 0, resource): amount
            for pool, amounts in per_pool.items() for resource, amount in amounts.items()
        }, lock_in_order=lock_in_order, missed=missed, sliced=True)
        return
    chosen: dict[str, int] = {}
    for pool, amounts in sorted(per_pool.items()):
        slice_number = 0
        if pool in slices:
            claim = min(pools[pool])
            if reserves_with_lock(transaction):
                charged = _claim_and_charge(transaction, pool, claim, amounts)
                if charged is not None:
                    chosen.update((placement.id, charged) for placement in placements
                                  if placement.pool == pool)
                    continue
            found = _claim(transaction, pool, claim, amounts)
            if found is None:
                raise SliceFragmented(pool, amounts)
            slice_number = found
            chosen.update((placement.id, found) for placement in placements
                          if placement.pool == pool)
        rows = {(pool, slice_number, resource): amount for resource, amount in amounts.items()}
        charge_rows(transaction, schema.pool_capacity, "pool", rows, lock_in_order=lock_in_order,
                    missed=SliceFragmented(pool, amounts) if pool in slices else missed,
                    sliced=True)
    if chosen:
        ordered = sorted(chosen.items())
        parameters: dict[str, Any] = {}
        for index, (request_id, slice_number) in enumerate(ordered):
            parameters[f"id_{index}"] = request_id
            parameters[f"slice_{index}"] = slice_number
        transaction.execute(_record_statement(len(ordered)), parameters)


def return_statement_parameters(
    amounts: dict[tuple[str, int, str], int], lock_in_order: bool
) -> tuple[sa.Update, dict[str, Any]]:
    """The conditional UPDATE that gives ``{(pool, slice, resource): amount}`` back."""
    statement = statements.charge_statement(
        schema.pool_capacity, "pool", len(amounts), lock_in_order=lock_in_order, charge=False,
        sliced=True)
    return statement, statements.sliced_charge_parameters(amounts)


def _locked_slices(connection: sa.Connection, pool: str) -> dict[str, dict[int, tuple[int, int]]]:
    """``{resource: {slice: (used, cap)}}`` of one pool, its rows locked in slice order."""
    capacity = schema.pool_capacity
    rows = connection.execute(
        sa.select(capacity.c.slice, capacity.c.resource, capacity.c.used, capacity.c.cap)
        .where(capacity.c.pool == pool)
        .order_by(capacity.c.slice, capacity.c.resource)
        .with_for_update()
    ).all()
    found: dict[str, dict[int, tuple[int, int]]] = {}
    for slice_number, resource, used, cap in rows:
        found.setdefault(resource, {})[int(slice_number)] = (int(used), int(cap))
    return found


def _write_caps(
    connection: sa.Connection, pool: str, resource: str, caps: Sequence[int],
    existing: Mapping[int, tuple[int, int]],
) -> None:
    capacity = schema.pool_capacity
    for slice_number, cap in enumerate(caps):
        if slice_number not in existing:
            connection.execute(capacity.insert().values(
                pool=pool, slice=slice_number, resource=resource, cap=cap, used=0))
        elif existing[slice_number][1] != cap:
            connection.execute(
                capacity.update()
                .where(capacity.c.pool == pool, capacity.c.slice == slice_number,
                       capacity.c.resource == resource)
                .values(cap=cap))


def rebalance(connection: sa.Connection, pool: str, need: Mapping[str, int]) -> bool:
    """Move room so one slice of ``pool`` fits ``need``; False if the pool has not the room.

    Locks every row of the pool in (slice, resource) order and holds nothing
    else, so admitters it waits for finish without waiting for it.
    """
    current = _locked_slices(connection, pool)
    if not current or any(resource not in current for resource in need):
        return False
    count = max(len(by_slice) for by_slice in current.values())
    first = min(current)
    # The slice with most room on the claim resource keeps its room and gets more.
    target = max(range(count), key=lambda index: (
        current[first].get(index, (0, 0))[1] - current[first].get(index, (0, 0))[0], -index))
    planned: dict[str, list[int]] = {}
    for resource, amount in need.items():
        by_slice = current[resource]
        used = [by_slice.get(index, (0, 0))[0] for index in range(count)]
        caps = [by_slice.get(index, (0, 0))[1] for index in range(count)]
        concentrated = concentrate(caps, used, target, amount)
        if concentrated is None:
            return False
        planned[resource] = concentrated
    for resource, caps in planned.items():
        _write_caps(connection, pool, resource, caps, current[resource])
    return True


def configure(
    connection: sa.Connection, pool: str, caps: Mapping[str, int], slices: int | None
) -> None:
    """Set ``pool``'s caps (the named resources) and its slice count; spread every cap.

    The caller holds the pool's row. More slices are always possible (the new
    ones start empty); fewer only while the slices that go are unused, since
    requests charged to a slice give their cost back to that slice.
    """
    current = _locked_slices(connection, pool)
    if slices is not None and not (set(current) | set(caps)):
        # The slice count lives in the capacity rows: a pool without any has none to keep.
        raise InvalidInput(f"pool {quoted(pool)} has no capacity to split into slices; set a "
                           "capacity with the slices", code="slices_without_capacity")
    count_now = max((len(by_slice) for by_slice in current.values()), default=1)
    count = count_now if slices is None else slices
    if count < count_now:
        busy = sorted({(resource, index) for resource, by_slice in current.items()
                       for index, (used, _cap) in by_slice.items() if index >= count and used})
        if busy:
            raise Conflict(
                f"pool {quoted(pool)} cannot go to {count} slices: slices {sorted({i for _, i in busy})} "
                "are in use; retry when their requests have ended", code="slice_in_use")
    for resource in sorted(set(current) | set(caps)):
        by_slice = current.get(resource, {})
        total = caps[resource] if resource in caps else sum(cap for _used, cap in by_slice.values())
        used = [by_slice.get(index, (0, 0))[0] for index in range(count)]
        _write_caps(connection, pool, resource, spread(total, used, count), by_slice)
    if count < count_now:
        capacity = schema.pool_capacity
        connection.execute(capacity.delete().where(capacity.c.pool == pool,
                                                   capacity.c.slice >= count))


def slice_count(connection: sa.Connection, pool: str) -> int:
    capacity = schema.pool_capacity
    found = connection.execute(
        sa.select(sa.func.max(capacity.c.slice)).where(capacity.c.pool == pool)).scalar()
    return 1 if found is None else int(found) + 1


def check(
    connection: sa.Connection, charged: Iterable[tuple[str | None, int | None, Mapping[str, int]]]
) -> list[str]:
    """Each slice of a sliced pool: its use equals the cost of the requests charged to it.

    ``charged`` is ``(pool, slice, cost)`` of every charged request. The sums
    over a pool are checked with the other holders (quotagate.store.views);
    this finds use moved between slices, which the sums cannot see.
    """
    capacity = schema.pool_capacity
    rows = connection.execute(
        sa.select(capacity.c.pool, capacity.c.slice, capacity.c.resource, capacity.c.used)
    ).all()
    sliced = {pool for pool, slice_number, _resource, _used in rows if slice_number > 0}
    expected: Counter[tuple[str, int, str]] = Counter()
    violations: list[str] = []
    known = {(pool, int(slice_number)) for pool, slice_number, _resource, _used in rows}
    for pool, slice_number, cost in charged:
        if pool is None or pool not in sliced:
            continue
        number = 0 if slice_number is None else int(slice_number)
        if (pool, number) not in known:
            violations.append(f"pool {pool}: a request is charged to slice {number}, "
                              "which does not exist")
        for resource, amount in cost.items():
            expected[pool, number, resource] += amount
    for pool, slice_number, resource, used in sorted(rows):
        if pool in sliced and int(used) != expected[pool, int(slice_number), resource]:
            violations.append(
                f"pool {pool} slice {slice_number} {resource}: used {used} but requests "
                f"charged to it cost {expected[pool, int(slice_number), resource]}")
    return violations
