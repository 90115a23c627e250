"""Budgets in the store: the budget rows, the usage buckets, and every change of them.

The rules are pure (:mod:`quotagate.domain.budget`). Here (docs/decisions/710):

- admission reads every budget row with the closed usage of its window in one
  statement (:func:`read_budgets`), and charges the reservations of what it
  admits with one conditional UPDATE per (tenant, resource) row, after the
  pools (:func:`charge`): the row's live ``reserved`` and ``accrued`` enter the
  condition, so whatever committed since the read is counted, exactly;
- release (:func:`accrue`) locks the tenants' budget rows, adds each released
  request's cost * seconds held to the hour buckets and to ``accrued``, and
  takes its reservation back; when it makes a new bucket it folds the buckets
  no window counts any more into one carried bucket (docs/decisions/713);
- an admin change (:func:`apply`) locks the tenant's running requests, then its
  budget rows, and recounts ``reserved`` from those requests.

Lock order (extends :mod:`quotagate.store.ledger`'s): request rows, quota rows,
rooms, pools, budget rows, usage buckets.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.budget import (
    BUCKET,
    CARRIED,
    SOMETHING_LEFT,
    BudgetLimit,
    Budgets,
    BudgetState,
    buckets,
    fold_before,
    format_duration,
    parse_budget,
    parse_duration,
    parse_grace,
    reservation,
)
from quotagate.domain.model import CHARGED_STATES, validate_resource
from quotagate.domain.placement import Placement
from quotagate.domain.sharing import KEEP
from quotagate.errors import InvalidInput, quoted
from quotagate.store import schema
from quotagate.store.dialect import reserves_with_lock
from quotagate.store.driver import DriverTransaction
from quotagate.store.rows import decode_cost

__all__ = ["BudgetChange", "accrue", "apply", "budget_change", "charge", "read_budgets",
           "reserved_by", "running_requests"]

_CHARGED = [state.value for state in CHARGED_STATES]


@dataclass(frozen=True)
class BudgetChange:
    """An admin change of a tenant's budgets: per resource a limit, or None to remove it;
    ``default_max_runtime``: seconds, None to remove it, absent (``keep``) to keep it;
    ``stop_at_max_runtime``: on, off, or None to keep it (docs/decisions/714);
    ``max_runtime_grace``: seconds past the max-runtime before the stop, None to keep it
    (docs/decisions/715)."""

    limits: Mapping[str, BudgetLimit | None]
    default_max_runtime: int | None = None
    keep_default: bool = True
    clear: bool = False  # remove every budget of the tenant first (``--budget none``)
    stop_at_max_runtime: bool | None = None
    max_runtime_grace: int | None = None

    def describe(self) -> str:
        parts = ["budget=none"] if self.clear else []
        parts += [f"budget.{resource}={'none' if limit is None else limit.describe()}"
                 for resource, limit in sorted(self.limits.items())]
        if not self.keep_default:
            parts.append("default_max_runtime=" + (
                "none" if self.default_max_runtime is None
                else format_duration(self.default_max_runtime)))
        if self.stop_at_max_runtime is not None:
            parts.append(f"stop_at_max_runtime={'on' if self.stop_at_max_runtime else 'off'}")
        if self.max_runtime_grace is not None:
            parts.append(f"max_runtime_grace={self.max_runtime_grace}s")
        return ",".join(parts)


def budget_change(
    limits: Mapping[str, object] | None, clear: bool, default_max_runtime: object,
    stop_at_max_runtime: object = None, max_runtime_grace: object = None,
) -> BudgetChange | None:
    """Validate an admin change of budgets (before anything is written); None: no change.

    ``limits``: per resource ``"100h/30d"`` or None (removed); ``default_max_runtime``:
    a duration, None (removed) or :data:`~quotagate.domain.sharing.KEEP`;
    ``stop_at_max_runtime``: True, False or None (kept); ``max_runtime_grace``: seconds
    or a duration, None (kept).
    """
    keep = default_max_runtime is KEEP
    if (not limits and not clear and keep and stop_at_max_runtime is None
            and max_runtime_grace is None):
        return None
    if stop_at_max_runtime is not None and not isinstance(stop_at_max_runtime, bool):
        raise InvalidInput(f"stop_at_max_runtime must be true or false, got "
                           f"{quoted(stop_at_max_runtime)}", code="invalid_stop_at_max_runtime")
    parsed: dict[str, BudgetLimit | None] = {}
    for resource, text in (limits or {}).items():
        validate_resource(resource)
        parsed[resource] = None if text is None else parse_budget(text)
    default = None if keep or default_max_runtime is None else parse_duration(
        default_max_runtime, what="default_max_runtime")
    grace = None if max_runtime_grace is None else parse_grace(max_runtime_grace)
    return BudgetChange(parsed, default, keep_default=keep, clear=clear,
                        stop_at_max_runtime=stop_at_max_runtime, max_runtime_grace=grace)


@lru_cache(maxsize=1)
def budget_query() -> sa.Select[Any]:
    """Every budget row with the closed usage its window counts (``now``), one statement.

    A bucket ``b`` covers ``[b, b + BUCKET)``; it overlaps the window ``[now -
    window, now]`` when ``b > now - window - BUCKET``, and is counted whole.
    """
    budget, usage = schema.tenant_budget, schema.budget_usage
    spent = (
        sa.select(sa.func.coalesce(sa.func.sum(usage.c.amount), 0))
        .where(usage.c.tenant == budget.c.tenant, usage.c.resource == budget.c.resource,
               usage.c.bucket > sa.bindparam("now", type_=sa.Double)
               - budget.c.window_length - BUCKET)
        .scalar_subquery()
    )
    return sa.select(budget.c.tenant, budget.c.resource, budget.c.amount,
                     budget.c.window_length, budget.c.reserved, budget.c.accrued,
                     spent.label("spent"))


def budgets_from_rows(rows: Iterable[Any]) -> Budgets:
    return Budgets({
        (row[0], row[1]): BudgetState(int(row[2]), int(row[3]), int(row[4]), int(row[6]),
                                      int(row[5]))
        for row in rows
    })


def read_budgets(connection: sa.Connection, now: float) -> Budgets:
    return budgets_from_rows(connection.execute(budget_query(), {"now": now}))


@lru_cache(maxsize=64)
def _charge_statement(count: int, *, lock_in_order: bool) -> sa.Update:
    """Reserve ``n_i`` on ``count`` budget rows (``t_i``, ``r_i``) in one UPDATE, each
    only where it fits; the caller checks that ``count`` rows changed.

    ``s_i`` is the window's usage as read, minus ``accrued`` as read (plus
    one resource-second for a request without a max-runtime, which needs
    something left: ``Budgets.blocking``'s condition exactly): adding the live
    ``accrued`` counts every release committed since, exactly (time passing
    only drops buckets, so the sum can over-count, never under-count). With
    ``lock_in_order`` (PostgreSQL) the rows are locked in key order first, as
    :func:`quotagate.store.statements.charge_statement` does.
    """
    budget = schema.tenant_budget
    rows = [sa.and_(budget.c.tenant == sa.bindparam(f"t_{i}"),
                    budget.c.resource == sa.bindparam(f"r_{i}")) for i in range(count)]
    amount = sa.case(*((row, sa.bindparam(f"n_{i}", type_=sa.BigInteger))
                       for i, row in enumerate(rows)))
    slack = sa.case(*((row, sa.bindparam(f"s_{i}", type_=sa.BigInteger))
                      for i, row in enumerate(rows)))
    statement = budget.update().where(
        budget.c.reserved + amount + slack + budget.c.accrued <= budget.c.amount)
    if lock_in_order:
        locked = (
            sa.select(budget.c.tenant.label("tenant"), budget.c.resource.label("resource"))
            .where(sa.or_(*rows)).order_by(budget.c.tenant, budget.c.resource)
            .with_for_update().subquery("locked"))
        statement = statement.where(budget.c.tenant == locked.c.tenant,
                                    budget.c.resource == locked.c.resource)
    else:
        statement = statement.where(sa.or_(*rows))
    return statement.values(reserved=budget.c.reserved + amount)


def charge(transaction: DriverTransaction, placements: Iterable[Placement],
           budgets: Budgets) -> bool:
    """Reserve the budgets of admitted work; False if one no longer fits (roll back)."""
    amounts: dict[tuple[str, str], int] = defaultdict(int)
    for placement in placements:
        if placement.tenant not in budgets.tenants:
            continue
        needs = reservation(placement.cost, placement.runtime)
        for resource in placement.cost:
            if (placement.tenant, resource) in budgets.states:
                amounts[placement.tenant, resource] += needs.get(resource, 0)
    if not amounts:
        return True
    parameters: dict[str, Any] = {}
    for index, ((tenant, resource), amount) in enumerate(sorted(amounts.items())):
        state = budgets.states[tenant, resource]
        parameters.update({f"t_{index}": tenant, f"r_{index}": resource, f"n_{index}": amount,
                           f"s_{index}": state.spent - state.accrued
                           + (0 if amount else SOMETHING_LEFT)})
    statement = _charge_statement(len(amounts), lock_in_order=reserves_with_lock(transaction))
    return transaction.rowcount(statement, parameters) == len(amounts)


@lru_cache(maxsize=64)
def _budgeted_query(count: int) -> sa.Select[Any]:
    """The budgets of ``count`` tenants (``tenant_0`` …), in (tenant, resource) order."""
    budget = schema.tenant_budget
    return (sa.select(budget.c.tenant, budget.c.resource, budget.c.window_length)
            .where(budget.c.tenant.in_([sa.bindparam(f"tenant_{i}") for i in range(count)]))
            .order_by(budget.c.tenant, budget.c.resource))


def accrue(connection: sa.Connection, transaction: DriverTransaction,
           rows: Iterable[Mapping[str, Any]], now: float) -> None:
    """Released requests' usage into their tenants' budgets, in the release's transaction.

    ``rows``: the locked request rows whose cost came back (tenant, cost,
    admitted, reserved_runtime). Usage is cost * (now - admitted), split into
    hour buckets; the reservation made at admission is taken back. Which tenants
    have budgets is read on ``transaction`` (every release asks); a budgeted
    tenant's writes go through ``connection``, the same transaction (docs/decisions/246).
    """
    by_tenant: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_tenant[row["tenant"]].append(row)
    if not by_tenant:
        return
    budget = schema.tenant_budget
    # No lock here: the UPDATE below takes the row's, and an admin change of the
    # tenant's budgets first locks its running requests, which this release holds.
    budgeted = transaction.rows(_budgeted_query(len(by_tenant)), {
        f"tenant_{index}": tenant for index, tenant in enumerate(sorted(by_tenant))})
    for tenant, resource, window in budgeted:
        held: dict[int, float] = defaultdict(float)
        returned = 0
        for row in by_tenant[tenant]:
            amount = decode_cost(row["cost"]).get(resource, 0)
            if not amount:
                continue
            returned += amount * (row["reserved_runtime"] or 0)
            if row["admitted"] is None:
                continue  # admitted before budgets existed: nothing known to accrue
            for bucket, seconds in buckets(row["admitted"], now):
                held[bucket] += amount * seconds
        spent = {bucket: math.ceil(value) for bucket, value in held.items()}
        accrued = sum(spent.values())
        if not returned and not accrued:
            continue
        if connection.execute(
            budget.update()
            .where(budget.c.tenant == tenant, budget.c.resource == resource)
            .values(reserved=sa.case((budget.c.reserved >= returned,
                                      budget.c.reserved - returned), else_=0),
                    accrued=budget.c.accrued + accrued)).rowcount == 0:
            continue
        # Under the budget row's lock: no other transaction writes these buckets.
        new_bucket = False
        for bucket, used in sorted(spent.items()):
            if not _add_to_bucket(connection, tenant, resource, bucket, used):
                new_bucket = True
        # In steady use a budget gets a new bucket once an hour: folding then keeps its
        # buckets bounded by its window for one range read an hour, not one per release.
        if new_bucket:
            _fold_old_buckets(connection, tenant, resource, int(window), now)


def _add_to_bucket(connection: sa.Connection, tenant: str, resource: str, bucket: int,
                   amount: int) -> bool:
    """Add ``amount`` to a usage bucket, making it if need be; False if it was made."""
    usage = schema.budget_usage
    where = (usage.c.tenant == tenant, usage.c.resource == resource, usage.c.bucket == bucket)
    if connection.execute(usage.update().where(*where)
                          .values(amount=usage.c.amount + amount)).rowcount:
        return True
    connection.execute(usage.insert().values(tenant=tenant, resource=resource, bucket=bucket,
                                             amount=amount))
    return False


def _fold_old_buckets(connection: sa.Connection, tenant: str, resource: str, window: int,
                     now: float) -> int:
    """Fold the buckets no window counts any more into the carried bucket; how many went.

    The caller holds the budget row's lock (release's accrual), so no other
    transaction writes these buckets. The buckets' total stays ``accrued``
    (``check`` recounts it), and what admission and ``tenant show`` count is
    unchanged: they count only buckets from the window's start
    (docs/decisions/713).
    """
    usage = schema.budget_usage
    old = (usage.c.tenant == tenant, usage.c.resource == resource,
           usage.c.bucket > CARRIED, usage.c.bucket < fold_before(now, window))
    count, total = connection.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(usage.c.amount), 0))
        .where(*old)).one()
    if not count:
        return 0
    connection.execute(usage.delete().where(*old))
    if total:
        _add_to_bucket(connection, tenant, resource, CARRIED, int(total))
    return int(count)


def running_requests(connection: sa.Connection, tenant: str | None, *,
                     lock: bool = False) -> list[Any]:
    """Charged requests (of ``tenant``, or all), with what budgets need of them."""
    request = schema.request
    query = (sa.select(request.c.id, request.c.tenant, request.c.cost, request.c.admitted,
                       request.c.reserved_runtime)
             .where(request.c.state.in_(_CHARGED)).order_by(request.c.id))
    if tenant is not None:
        query = query.where(request.c.tenant == tenant)
    if lock:
        query = query.with_for_update()
    return list(connection.execute(query))


def reserved_by(running: Iterable[Any]) -> dict[tuple[str, str], int]:
    """What ``running`` requests reserve, per (tenant, resource)."""
    reserved: dict[tuple[str, str], int] = defaultdict(int)
    for row in running:
        for resource, amount in reservation(decode_cost(row.cost), row.reserved_runtime).items():
            reserved[row.tenant, resource] += amount
    return reserved


def apply(connection: sa.Connection, tenant: str, change: BudgetChange) -> None:
    """Set or remove budgets of ``tenant`` (its tenant row locked by the caller).

    The running requests are locked first (the order release takes), so none
    is released between the recount of ``reserved`` and the write of it.
    """
    if not change.keep_default:
        connection.execute(schema.tenant.update().where(schema.tenant.c.name == tenant)
                           .values(default_max_runtime=change.default_max_runtime))
    if change.stop_at_max_runtime is not None:
        connection.execute(schema.tenant.update().where(schema.tenant.c.name == tenant)
                           .values(stop_at_max_runtime=change.stop_at_max_runtime))
    if change.max_runtime_grace is not None:
        connection.execute(schema.tenant.update().where(schema.tenant.c.name == tenant)
                           .values(max_runtime_grace=change.max_runtime_grace))
    if not change.limits and not change.clear:
        return
    # Running requests first (release's lock order): no release of this tenant is
    # between its accrual and our write, and the recount below is exact.
    reserved = reserved_by(running_requests(connection, tenant, lock=True))
    budget, usage = schema.tenant_budget, schema.budget_usage
    if change.clear:
        connection.execute(budget.delete().where(budget.c.tenant == tenant))
        connection.execute(usage.delete().where(usage.c.tenant == tenant))
    existing = set(connection.execute(
        sa.select(budget.c.resource).where(budget.c.tenant == tenant)
        .order_by(budget.c.resource).with_for_update()).scalars())
    for resource, limit in sorted(change.limits.items()):
        if limit is None:
            connection.execute(budget.delete().where(budget.c.tenant == tenant,
                                                     budget.c.resource == resource))
            connection.execute(usage.delete().where(usage.c.tenant == tenant,
                                                    usage.c.resource == resource))
            continue
        values = {"amount": limit.amount, "window_length": limit.window,
                  "reserved": reserved.get((tenant, resource), 0)}
        if resource in existing:
            connection.execute(budget.update().where(budget.c.tenant == tenant,
                                                     budget.c.resource == resource)
                               .values(values))
        else:
            connection.execute(budget.insert().values(tenant=tenant, resource=resource,
                                                      accrued=0, **values))
