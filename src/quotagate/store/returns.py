"""The cost of ended requests given back, in the one lock order admission charges in.

Admission locks plain tenants' quota rows, then cohort members' quota rows,
then the cohorts' rooms, then pool rows, each kind in key order
(docs/decisions/041-one-lock-order.md). A release that gave a batch's cost
back tenant by tenant in name order, each member's room right after its rows,
crossed that order: holding member ``team-a`` it waited for plain ``team-c``,
which an admitter held while it waited for ``team-a``. PostgreSQL stalls both
for ``deadlock_timeout`` and MariaDB rolls one back. Here the return takes the
same order:

1. plain tenants' rows, then members' rows, each in (tenant, resource) order;
   which tenants are members is read first without a lock (on PostgreSQL the
   release's state move returns it, docs/decisions/248; an admin change of
   membership meanwhile at worst costs a deadlock the server breaks; the rooms
   are still computed from the rows as locked);
2. the rooms, one conditional UPDATE in (cohort, resource) order, by the
   change each member's locked row says;
3. the pool rows, (pool, slice, resource) order, each request's cost to the
   slice it was charged to.

PostgreSQL returns a group's rows in one UPDATE whose rows are first locked by
a sorted ``SELECT … FOR UPDATE`` (its UPDATE alone locks in heap order);
MySQL and MariaDB lock and read the group's rows with a sorted ``SELECT … FOR
UPDATE`` (InnoDB locks in key order as it scans), then update them; SQLite has
one writer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.sharing import MemberLimits, shared_delta
from quotagate.store import pool_slices, schema, statements
from quotagate.store.dialect import reserves_with_lock, update_returns_rows
from quotagate.store.driver import DriverTransaction

__all__ = ["return_cost"]

# What a member's locked quota row says: (used before the return, limits, root).
_Before = tuple[int, MemberLimits, str | None]


@lru_cache(maxsize=256)
def _tenant_return_statement(count: int, lock_in_order: bool) -> sa.Update:
    """Give ``count`` (tenant, resource) amounts back; the rows come back as they are after."""
    quota = schema.tenant_quota
    return statements.charge_statement(
        quota, "tenant", count, lock_in_order=lock_in_order, charge=False,
    ).returning(quota.c.tenant, quota.c.resource, quota.c.used, quota.c.cap,
                quota.c.borrowing_limit, quota.c.lending_limit, quota.c.cohort_root)


@lru_cache(maxsize=64)
def _members_query(count: int) -> sa.Select[Any]:
    """Which of ``count`` tenants (``tenant_0`` …) are cohort members."""
    quota = schema.tenant_quota
    return (sa.select(quota.c.tenant).distinct()
            .where(quota.c.tenant.in_([sa.bindparam(f"tenant_{i}") for i in range(count)]),
                   quota.c.cohort_root.is_not(None)))


def _tenant_parameters(tenants: list[str]) -> dict[str, str]:
    return {f"tenant_{index}": tenant for index, tenant in enumerate(tenants)}


def _limits(row: Any) -> MemberLimits:
    # A member row: (tenant, resource, used, cap, borrowing_limit, lending_limit, cohort_root).
    return MemberLimits(int(row[3]), None if row[4] is None else int(row[4]),
                        None if row[5] is None else int(row[5]))


def _return_group(
    transaction: DriverTransaction, amounts: Mapping[tuple[str, str], int],
) -> dict[tuple[str, str], _Before]:
    """Give ``amounts`` back to tenant rows; what each row held before, as locked."""
    parameters = statements.charge_parameters(dict(amounts))
    before: dict[tuple[str, str], _Before] = {}
    if update_returns_rows(transaction):
        rows = transaction.rows(
            _tenant_return_statement(len(amounts), reserves_with_lock(transaction)),
            parameters)
        for row in rows:
            key = (row[0], row[1])
            before[key] = (int(row[2]) + amounts[key], _limits(row), row[6])
        if len(rows) != len(amounts):
            raise RuntimeError(f"ledger inconsistent: cannot return {dict(amounts)} to tenants")
        return before
    tenants = sorted({tenant for tenant, _resource in amounts})
    for row in transaction.rows(statements.lock_members_query(len(tenants)),
                                _tenant_parameters(tenants)):
        if (row[0], row[1]) in amounts:
            before[row[0], row[1]] = (int(row[2]), _limits(row), row[6])
    count = transaction.rowcount(
        statements.charge_statement(schema.tenant_quota, "tenant", len(amounts), charge=False),
        parameters)
    if count != len(amounts):
        raise RuntimeError(f"ledger inconsistent: cannot return {dict(amounts)} to tenants")
    return before


def return_cost(
    transaction: DriverTransaction, tenant_amounts: Mapping[tuple[str, str], int],
    pool_amounts: Mapping[tuple[str, int, str], int], *,
    members: AbstractSet[str] | None = None,
) -> None:
    """Give back ``{(tenant, resource): n}`` and ``{(pool, slice, resource): n}``, in the
    lock order; a row that cannot take its return means the ledger is inconsistent.

    ``members``: which of the tenants are cohort members, if the caller read it
    already without a lock (PostgreSQL's state move returns it, docs/decisions/248);
    else it is read here, as step 1 says."""
    lock_in_order = reserves_with_lock(transaction)
    if tenant_amounts:
        if members is None:
            tenants = sorted({tenant for tenant, _resource in tenant_amounts})
            members = {row[0] for row in transaction.rows(_members_query(len(tenants)),
                                                          _tenant_parameters(tenants))}
        room: Counter[tuple[str, str]] = Counter()
        for group in (
            {key: amount for key, amount in tenant_amounts.items() if key[0] not in members},
            {key: amount for key, amount in tenant_amounts.items() if key[0] in members},
        ):
            if not group:
                continue
            for (tenant, resource), (used, limits, root) in _return_group(
                    transaction, group).items():
                if root is None:
                    continue
                delta = shared_delta(limits, used, -group[tenant, resource])
                if delta:
                    room[root, resource] += -delta
        if room:
            count = transaction.rowcount(
                statements.charge_statement(schema.cohort_usage, "cohort", len(room),
                                            lock_in_order=lock_in_order, charge=False),
                statements.charge_parameters(dict(room)))
            if count != len(room):
                raise RuntimeError(f"ledger inconsistent: cannot return {dict(room)} to rooms")
    if not pool_amounts:
        return
    statement, parameters = pool_slices.return_statement_parameters(
        dict(pool_amounts), lock_in_order)
    count = transaction.rowcount(statement, parameters)
    if count != len(pool_amounts):
        raise RuntimeError(f"ledger inconsistent: cannot return {dict(pool_amounts)} to pools")
