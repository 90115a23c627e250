"""Cohort accounting in the store: the shared room rows and every change of them.

The rules are pure (:mod:`quotagate.domain.sharing`); this module keeps
``qg_cohort_usage`` equal to what they say, in the transaction of every change
of a member's use or limits:

- admission (:func:`charge_members`), release (:mod:`quotagate.store.returns`)
  and a topic (:func:`adjust_tenant`) lock the member's quota rows, compute the
  exact change of the shared room from the locked values, and charge it with a
  conditional UPDATE — one row per root cohort and resource, like a pool row;
- an admin change of a member, a cohort or the tree (:func:`rebuild`) locks the
  room rows first and recomputes them from the members.

Lock order (extends the one in :mod:`quotagate.store.ledger`): request rows,
plain tenants' quota rows, members' tenant and quota rows, room rows, pool rows.
A tenant without a cohort costs one more read on release, nothing else.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.budget import Budgets
from quotagate.domain.placement import Placement
from quotagate.domain.sharing import (
    KEEP,
    Keep,
    Member,
    MemberLimits,
    Sharing,
    TenantSharing,
    attribute_lending,
    cohort_totals,
    root_of,
    shared_delta,
    would_cycle,
)
from quotagate.errors import InvalidInput, NotFound, quoted
from quotagate.store import schema, statements
from quotagate.store.dialect import update_returns_rows
from quotagate.store.driver import DriverTransaction
from quotagate.store.rows import adjust_usage

Usage = dict[str, dict[str, tuple[int, int]]]


@lru_cache(maxsize=4096)
def _limits(cap: Any, borrowing_limit: Any, lending_limit: Any) -> MemberLimits:
    """Limits from row values; cached, as a snapshot repeats the same few every admission."""
    return MemberLimits(
        int(cap),
        None if borrowing_limit is None else int(borrowing_limit),
        None if lending_limit is None else int(lending_limit),
    )


@dataclass
class Snapshot:
    """What admission plans on, from one read (:func:`statements.admission_snapshot_query`)."""

    tenants: Usage
    pools: Usage
    sharing: Sharing
    # Tenants' weights in fair sharing; absent: 1.
    weights: dict[str, int]
    # Tenants' preemption policies (reclaim, within-tenant); absent: never, never.
    policies: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Pools' capacity slices (quotagate.store.pool_slices); absent: one.
    slices: dict[str, int] = field(default_factory=dict)
    # Tenants with a budget (their state is read apart: quotagate.store.budgets).
    budgeted: set[str] = field(default_factory=set)
    budgets: Budgets = field(default_factory=Budgets)
    # The fair-share half-life (None: current use only) and, per tenant and
    # resource, its decayed past use and when it was last decayed.
    half_life: int | None = None
    decayed: dict[str, dict[str, tuple[float, float | None]]] = field(default_factory=dict)
    # Preemptors whose freed room is held (quotagate.store.holds), live or not.
    holds: list[str] = field(default_factory=list)


def snapshot_from_rows(rows: Iterable[Sequence[Any]]) -> Snapshot:
    """Tenants, pools, cohorts and weights from the admission snapshot's rows."""
    snapshot = Snapshot({}, {}, Sharing(), {})
    tenants, pools, sharing = snapshot.tenants, snapshot.pools, snapshot.sharing
    slice_rows: dict[tuple[str, str], int] = {}
    for kind, holder, resource, used, cap, borrowing_limit, lending_limit, root, decayed, \
            decayed_at in rows:
        if kind == "t":
            tenants.setdefault(holder, {})[resource] = (int(used), int(cap))
            if decayed:
                snapshot.decayed.setdefault(holder, {})[resource] = (float(decayed), decayed_at)
            if root is not None:
                sharing.roots[holder] = root
                sharing.limits[holder, resource] = _limits(cap, borrowing_limit, lending_limit)
        elif kind == "p":  # one row per capacity slice: summed here
            usage = pools.setdefault(holder, {})
            summed = usage.get(resource)
            if summed is None:
                usage[resource] = (int(used), int(cap))
            else:
                usage[resource] = (summed[0] + int(used), summed[1] + int(cap))
                slice_rows[holder, resource] = slice_rows.get((holder, resource), 1) + 1
        elif kind == "c":
            sharing.cohorts.setdefault(holder, {})[resource] = (int(used), int(cap))
        elif kind == "w":
            snapshot.weights[holder] = int(used)
        elif kind == "g":
            snapshot.budgeted.add(holder)
        elif kind == "h":
            snapshot.half_life = int(used)
        elif kind == "i":
            snapshot.holds.append(holder)
        else:
            snapshot.policies[holder] = (resource, root)
    for (pool, _resource), count in slice_rows.items():
        snapshot.slices[pool] = count
    return snapshot


def charge_members(
    transaction: DriverTransaction,
    placements: Sequence[Placement],
    roots: Mapping[str, str],
    *,
    lock_in_order: bool,
) -> bool:
    """Charge members' quota rows (up to nominal + borrowing limit) and their rooms.

    ``roots`` is the snapshot's membership, which the plan was made on. False
    when anything changed since (membership, use, limits, the room): the
    caller rolls back and plans again. Where an UPDATE returns rows, the
    charge itself says what each row held (one round trip); MySQL and MariaDB
    lock and read the rows first.
    """
    amounts: Counter[tuple[str, str]] = Counter()
    for placement in placements:
        for resource, amount in placement.cost.items():
            amounts[placement.tenant, resource] += amount
    parameters = statements.charge_parameters(dict(amounts))
    before: dict[tuple[str, str], tuple[int, MemberLimits, str | None]] = {}
    if update_returns_rows(transaction):
        charged = transaction.rows(
            # In (tenant, resource) order, as the plain tenants' charge: admitters
            # that lock members' rows in their plan's order deadlock on PostgreSQL.
            statements.borrowing_charge_statement(len(amounts), lock_in_order=lock_in_order,
                                                  returning=True), parameters)
        for row in charged:
            key = (row[0], row[1])
            before[key] = (int(row[2]) - amounts[key], _limits(row[3], row[4], row[5]), row[6])
        if len(charged) != len(amounts):
            return False
    else:
        tenants = sorted({tenant for tenant, _resource in amounts})
        for row in transaction.rows(
            statements.lock_members_query(len(tenants)),
            {f"tenant_{index}": tenant for index, tenant in enumerate(tenants)},
        ):
            before[row[0], row[1]] = (int(row[2]), _limits(row[3], row[4], row[5]), row[6])
    room: Counter[tuple[str, str]] = Counter()
    for key, amount in amounts.items():
        if key not in before:
            return False
        used, limits, root = before[key]
        if root != roots[key[0]] or used + amount > limits.ceiling:
            return False
        delta = shared_delta(limits, used, amount)
        if delta:
            room[root, key[1]] += delta
    if not update_returns_rows(transaction):
        count = transaction.rowcount(statements.borrowing_charge_statement(len(amounts)),
                                     parameters)
        if count != len(amounts):
            return False
    if not room:
        return True
    count = transaction.rowcount(
        statements.charge_statement(schema.cohort_usage, "cohort", len(room),
                                    lock_in_order=lock_in_order),
        statements.charge_parameters(dict(room)),
    )
    return count == len(room)


def adjust_tenant(
    connection: sa.Connection, tenant: str, amounts: Mapping[str, int], *, charge: bool
) -> bool:
    """Charge or return ``amounts`` on a tenant, and on its cohort's room if it has one.

    What topics use instead of :func:`quotagate.store.rows.adjust_usage` on
    tenant rows (a release returns a batch: :mod:`quotagate.store.returns`).
    A charge here never borrows (a topic is held within nominal).
    True when every row moved, else the caller rolls back. Where an UPDATE
    returns rows, a tenant without a cohort costs nothing more than before;
    MySQL and MariaDB read its rows under lock first.
    """
    resources = tuple(sorted(amounts))
    before: dict[str, tuple[int, MemberLimits]] = {}
    if update_returns_rows(connection):
        parameters: dict[str, Any] = {f"amount_{i}": amounts[r] for i, r in enumerate(resources)}
        parameters["holder"] = tenant
        rows = connection.execute(statements.adjust_statement(
            schema.tenant_quota, "tenant", resources, charge, returning=True), parameters).all()
        if len(rows) != len(resources):
            return False
        root = rows[0].cohort_root
        if root is None:
            return True
        for row in rows:
            signed = amounts[row.resource] if charge else -amounts[row.resource]
            before[row.resource] = (int(row.used) - signed,
                                    _limits(row.cap, row.borrowing_limit, row.lending_limit))
    else:
        locked = connection.execute(statements.lock_members_query(1), {"tenant_0": tenant}).all()
        root = locked[0][6] if locked else None
        if root is None:
            return adjust_usage(connection, schema.tenant_quota, "tenant", tenant, amounts,
                                charge=charge)
        before = {row[1]: (int(row[2]), _limits(row[3], row[4], row[5])) for row in locked}
        if not adjust_usage(connection, schema.tenant_quota, "tenant", tenant, amounts,
                            charge=charge):
            return False
    room: dict[str, int] = {}
    for resource, amount in amounts.items():
        if resource not in before:
            return False
        used, limits = before[resource]
        delta = shared_delta(limits, used, amount if charge else -amount)
        if delta:
            room[resource] = abs(delta)
    return not room or adjust_usage(connection, schema.cohort_usage, "cohort", root, room,
                                    charge=charge)


# -- the tree and the rooms (admin changes) -----------------------------------------


def cohort_parents(connection: sa.Connection) -> dict[str, str | None]:
    return {name: parent for name, parent in connection.execute(
        sa.select(schema.cohort.c.name, schema.cohort.c.parent))}


def members_of(connection: sa.Connection, root: str) -> list[ResourceMember]:
    quota = schema.tenant_quota
    rows = connection.execute(
        sa.select(quota.c.tenant, quota.c.resource, quota.c.used, quota.c.cap,
                  quota.c.borrowing_limit, quota.c.lending_limit)
        .where(quota.c.cohort_root == root)
        .order_by(quota.c.tenant, quota.c.resource)
    ).all()
    return [_member(row) for row in rows]


@dataclass(frozen=True)
class ResourceMember:
    """A member's standing for one resource, with the resource named."""

    resource: str
    member: Member


def _member(row: Any) -> ResourceMember:
    return ResourceMember(row[1], Member(row[0], int(row[2]), _limits(row[3], row[4], row[5])))


def rebuild(connection: sa.Connection, roots: Iterable[str | None]) -> None:
    """Recompute the room rows of ``roots`` from their members (after an admin change).

    The room rows are locked before the members are read: an admission or
    release that charged a room has committed by then (its member's new use is
    what is read), and one still waiting for the room computed its change from
    the member rows it holds locked, which is then added to the rebuilt value.
    """
    shared = schema.cohort_usage
    for root in sorted({root for root in roots if root is not None}):
        existing = {resource: (int(used), int(cap)) for resource, used, cap in connection.execute(
            sa.select(shared.c.resource, shared.c.used, shared.c.cap)
            .where(shared.c.cohort == root).order_by(shared.c.resource).with_for_update()
        )}
        by_resource: dict[str, list[Member]] = defaultdict(list)
        for entry in members_of(connection, root):
            by_resource[entry.resource].append(entry.member)
        for resource in sorted(set(existing) - set(by_resource)):
            connection.execute(shared.delete().where(shared.c.cohort == root,
                                                     shared.c.resource == resource))
        for resource, members in sorted(by_resource.items()):
            used, cap = cohort_totals(members)
            if resource not in existing:
                connection.execute(shared.insert().values(cohort=root, resource=resource,
                                                          used=used, cap=cap))
            elif existing[resource] != (used, cap):
                connection.execute(
                    shared.update().where(shared.c.cohort == root, shared.c.resource == resource)
                    .values(used=used, cap=cap))


def rooms(connection: sa.Connection) -> dict[str, dict[str, tuple[int, int]]]:
    """``{root: {resource: (shared used, shared cap)}}`` as stored."""
    shared = schema.cohort_usage
    result: dict[str, dict[str, tuple[int, int]]] = {}
    for root, resource, used, cap in connection.execute(
        sa.select(shared.c.cohort, shared.c.resource, shared.c.used, shared.c.cap)
    ):
        result.setdefault(root, {})[resource] = (int(used), int(cap))
    return result


@dataclass(frozen=True)
class Membership:
    """A tenant's cohort, and the roots its quota rows record (one, unless broken)."""

    tenant: str
    cohort: str | None
    roots: frozenset[str | None]


def memberships(connection: sa.Connection) -> list[Membership]:
    """Every tenant in a cohort or with a quota row that records a root."""
    tenant, quota = schema.tenant, schema.tenant_quota
    cohorts = dict(connection.execute(
        sa.select(tenant.c.name, tenant.c.cohort).where(tenant.c.cohort.is_not(None))).all())
    roots: dict[str, set[str | None]] = defaultdict(set)
    for name, root in connection.execute(sa.select(quota.c.tenant, quota.c.cohort_root)):
        roots[name].add(root)
    names = set(cohorts) | {name for name, recorded in roots.items() if recorded != {None}}
    return [Membership(name, cohorts.get(name), frozenset(roots.get(name, set())))
            for name in sorted(names)]


def all_members(connection: sa.Connection) -> dict[str, list[ResourceMember]]:
    """Every member's standing per resource, by root cohort."""
    quota = schema.tenant_quota
    result: dict[str, list[ResourceMember]] = {}
    for row in connection.execute(
        sa.select(quota.c.tenant, quota.c.resource, quota.c.used, quota.c.cap,
                  quota.c.borrowing_limit, quota.c.lending_limit, quota.c.cohort_root)
        .where(quota.c.cohort_root.is_not(None))
        .order_by(quota.c.tenant, quota.c.resource)
    ):
        result.setdefault(row[6], []).append(_member(row))
    return result


# -- admin changes ------------------------------------------------------------------


def lock_quota_rows(connection: sa.Connection, tenants: Sequence[str]) -> None:
    """Lock every quota row of ``tenants`` in (tenant, resource) order (docs/decisions/041).

    An UPDATE of several rows alone locks them in the order it scans them, on
    PostgreSQL the order they are stored in: holding team-b's row it would wait for
    team-a's, which an admission or release charging both holds while it waits for
    team-b's. Taken first in key order, the later UPDATEs only rewrite held rows.
    """
    quota = schema.tenant_quota
    connection.execute(
        sa.select(quota.c.tenant, quota.c.resource).where(quota.c.tenant.in_(tenants))
        .order_by(quota.c.tenant, quota.c.resource).with_for_update()
    ).all()


def set_cohort(
    connection: sa.Connection, name: str, parent: str | Keep | None, now: float
) -> tuple[str | None, bool]:
    """Create a cohort or move it in the tree; return (its parent, whether it was created).

    Moving a cohort moves its whole subtree: the members' quota rows get the new
    ``cohort_root``, then the old and the new root's rooms are rebuilt.
    """
    table = schema.cohort
    row = connection.execute(
        sa.select(table.c.parent).where(table.c.name == name).with_for_update()).first()
    parents = cohort_parents(connection)
    if parent is not KEEP and parent is not None:
        assert isinstance(parent, str)
        if parent not in parents:
            raise NotFound(f"cohort {quoted(parent)} does not exist; create it first",
                           code="unknown_cohort")
        if parent == name or would_cycle(name, parent, parents):
            raise InvalidInput(f"cohort {quoted(parent)} is inside {quoted(name)}: the tree would loop",
                               code="cohort_cycle")
    if row is None:
        chosen = None if parent is KEEP else parent
        assert not isinstance(chosen, Keep)
        connection.execute(table.insert().values(name=name, parent=chosen, created=now))
        return chosen, True
    old_parent: str | None = row[0]
    if parent is KEEP or parent == old_parent:
        return old_parent, False
    assert not isinstance(parent, Keep)
    old_root = root_of(name, parents)
    connection.execute(table.update().where(table.c.name == name).values(parent=parent))
    parents[name] = parent
    new_root = root_of(name, parents)
    # The moved cohort and everything under it: those whose path up reaches it.
    subtree = [cohort for cohort in parents if would_cycle(name, cohort, parents)]
    tenant, quota = schema.tenant, schema.tenant_quota
    moved = sorted(connection.execute(
        sa.select(tenant.c.name).where(tenant.c.cohort.in_(subtree))).scalars())
    if moved:
        # Rewriting the quota rows locks them: an admission or release of a moved
        # tenant either finished before (and is in the rebuilt rooms) or reads the
        # new root from the row it charges.
        lock_quota_rows(connection, moved)
        connection.execute(quota.update().where(quota.c.tenant.in_(moved))
                           .values(cohort_root=new_root))
    rebuild(connection, [old_root, new_root])
    return parent, False


def apply_tenant_sharing(
    connection: sa.Connection, name: str, change: TenantSharing, old_cohort: str | None
) -> None:
    """Apply ``change`` to a tenant whose row this transaction holds.

    Called after the quota caps were set, so limits are judged against the new
    nominal. Then the tenant's quota rows get its root cohort and the rooms of
    the old and the new root are rebuilt — also when only the quota changed,
    since a member's nominal is part of its cohort's room.
    """
    tenant, quota = schema.tenant, schema.tenant_quota
    parents = cohort_parents(connection)
    old_root = None if old_cohort is None else root_of(old_cohort, parents)
    new_root = old_root
    # The tenant row's changes, written in one UPDATE (this transaction holds the row).
    values: dict[str, Any] = {}
    if change.cohort is not KEEP:
        cohort_name = change.cohort
        if cohort_name is None:
            new_root = None
            values["cohort"] = None
            # Limits mean something only in a cohort; leaving it forgets them.
            connection.execute(quota.update().where(quota.c.tenant == name)
                               .values(borrowing_limit=None, lending_limit=None))
        else:
            assert isinstance(cohort_name, str)
            if cohort_name not in parents:
                raise NotFound(f"cohort {quoted(cohort_name)} does not exist; create it with "
                               "'quotagate cohort set'", code="unknown_cohort")
            new_root = root_of(cohort_name, parents)
            values["cohort"] = cohort_name
    if change.max_priority is not KEEP:
        values["max_priority"] = change.max_priority
    for column, value in (("weight", change.weight), ("reclaim", change.reclaim),
                          ("within_tenant", change.within_tenant),
                          ("on_preempt", change.on_preempt)):
        if value is not None:
            values[column] = value
    if values:
        connection.execute(tenant.update().where(tenant.c.name == name).values(values))
    if change.borrowing_limit or change.lending_limit:
        if new_root is None:
            # Which option or field sets it is the surface's to say (errors.with_hint).
            raise InvalidInput(
                f"tenant {quoted(name)} is in no cohort: borrowing and lending limits need one",
                code="not_in_cohort")
        caps = {resource: int(cap) for resource, cap in connection.execute(
            sa.select(quota.c.resource, quota.c.cap).where(quota.c.tenant == name))}
        for column, limits in (("borrowing_limit", change.borrowing_limit),
                               ("lending_limit", change.lending_limit)):
            for resource, amount in sorted(limits.items()):
                if resource not in caps:
                    raise InvalidInput(
                        f"tenant {quoted(name)} has no quota for {quoted(resource)}: set its "
                        "nominal quota first", code="unknown_quota_resource", resource=resource)
                if column == "lending_limit" and amount is not None and amount > caps[resource]:
                    raise InvalidInput(
                        f"lending limit for {quoted(resource)} ({amount}) is above the nominal quota "
                        f"({caps[resource]}): a tenant lends only what it has",
                        code="invalid_lending_limit")
                connection.execute(quota.update().where(quota.c.tenant == name,
                                                        quota.c.resource == resource)
                                   .values({column: amount}))
    # Every quota row of a member names its root, new rows (just set) included.
    connection.execute(quota.update().where(quota.c.tenant == name).values(cohort_root=new_root))
    rebuild(connection, [old_root, new_root])


def describe_cohort(connection: sa.Connection, name: str) -> dict[str, Any]:
    """A cohort: its parent, root, children, member tenants and (for a root) its room."""
    parents = cohort_parents(connection)
    if name not in parents:
        raise NotFound(f"cohort {quoted(name)} does not exist", code="unknown_cohort")
    root = root_of(name, parents)
    tenant = schema.tenant
    members = list(connection.execute(
        sa.select(tenant.c.name).where(tenant.c.cohort == name).order_by(tenant.c.name)
    ).scalars())
    room = rooms(connection).get(root, {}) if root == name else {}
    return {
        "name": name,
        "parent": parents[name],
        "root": root,
        "children": sorted(child for child, parent in parents.items() if parent == name),
        "tenants": members,
        "room": {resource: {"used": used, "cap": cap}
                 for resource, (used, cap) in sorted(room.items())},
    }


def describe_member(
    connection: sa.Connection, name: str, quota: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """A tenant's cohort, root, weight and maximum priority; a member's limits are
    added to ``quota``."""
    tenant, table = schema.tenant, schema.tenant_quota
    row = connection.execute(sa.select(tenant.c.cohort, tenant.c.weight, tenant.c.max_priority,
                                       tenant.c.reclaim, tenant.c.within_tenant,
                                       tenant.c.on_preempt)
                             .where(tenant.c.name == name)).one()
    root = None if row.cohort is None else root_of(row.cohort, cohort_parents(connection))
    if row.cohort is not None:
        for resource, borrowing_limit, lending_limit in connection.execute(
            sa.select(table.c.resource, table.c.borrowing_limit, table.c.lending_limit)
            .where(table.c.tenant == name)
        ):
            if resource in quota:
                quota[resource]["borrowing_limit"] = borrowing_limit
                quota[resource]["lending_limit"] = lending_limit
    return {"cohort": row.cohort, "cohort_root": root, "weight": int(row.weight),
            "max_priority": row.max_priority, "reclaim": row.reclaim,
            "within_tenant": row.within_tenant, "on_preempt": row.on_preempt}


# -- views and the invariant check ----------------------------------------------------


@dataclass(frozen=True)
class Standing:
    """A tenant's place in its cohort for one resource (``inspect``, ``GET /v1/usage``)."""

    cohort: str
    root: str
    borrowed: int
    lent: int


def standing(connection: sa.Connection) -> dict[tuple[str, str], Standing]:
    """``{(tenant, resource): Standing}`` for every member."""
    leaves = {entry.tenant: entry.cohort for entry in memberships(connection)}

    result: dict[tuple[str, str], Standing] = {}
    for root, entries in all_members(connection).items():
        by_resource: dict[str, list[Member]] = defaultdict(list)
        for entry in entries:
            by_resource[entry.resource].append(entry.member)
        for resource, members in by_resource.items():
            lent = attribute_lending(members)
            for member in members:
                result[member.tenant, resource] = Standing(
                    leaves.get(member.tenant) or root, root, member.borrowed,
                    lent[member.tenant])
    return result


@dataclass(frozen=True)
class CheckRows:
    """What the cohort invariants are checked on, read in the check's one snapshot."""

    parents: dict[str, str | None]
    memberships: list[Membership]
    members: dict[str, list[ResourceMember]]
    rooms: dict[str, dict[str, tuple[int, int]]]

    @property
    def member_names(self) -> set[str]:
        return {entry.tenant for entry in self.memberships if entry.roots - {None}}


def read_for_check(connection: sa.Connection) -> CheckRows:
    return CheckRows(cohort_parents(connection), memberships(connection),
                     all_members(connection), rooms(connection))


def check(rows: CheckRows) -> list[str]:
    """The cohort invariants (docs/fair-sharing.md); an empty list means they hold.

    Per member: used <= nominal + borrowing limit, and its root is its cohort's.
    Per root cohort and resource: the stored room equals the one recomputed from
    the members and is not over its cap, the members together use no more than
    their summed nominal, and the borrowers' excess is covered by lendable room,
    so that nobody lends more than its lending limit.
    """
    violations: list[str] = []
    for membership in rows.memberships:
        tree_root: str | None = None
        if membership.cohort is not None:
            if membership.cohort not in rows.parents:
                violations.append(f"tenant {membership.tenant} is in cohort "
                                  f"{membership.cohort}, which does not exist")
                continue
            tree_root = root_of(membership.cohort, rows.parents)
        if membership.roots and membership.roots != {tree_root}:
            recorded = ", ".join(sorted(str(root) for root in membership.roots))
            violations.append(f"tenant {membership.tenant}: its quota rows record root cohort "
                              f"{recorded}, its cohort's tree says {tree_root}")
    for root in sorted(set(rows.members) | set(rows.rooms)):
        by_resource: dict[str, list[Member]] = defaultdict(list)
        for entry in rows.members.get(root, []):
            by_resource[entry.resource].append(entry.member)
        stored = rows.rooms.get(root, {})
        for resource in sorted(set(by_resource) | set(stored)):
            members = by_resource.get(resource, [])
            expected = cohort_totals(members)
            actual = stored.get(resource)
            where = f"cohort {root} {resource}"
            if actual != expected:
                violations.append(f"{where}: room stored as {actual} (used, cap) but its "
                                  f"members make {expected}")
            if actual is not None and actual[0] > actual[1]:
                violations.append(f"{where}: room used {actual[0]} > cap {actual[1]}")
            for member in members:
                if member.used > member.limits.ceiling:
                    violations.append(
                        f"tenant {member.tenant} {resource}: used {member.used} > nominal "
                        f"{member.limits.nominal} + borrowing limit "
                        f"{member.limits.borrowing_limit}")
            used = sum(member.used for member in members)
            nominal = sum(member.limits.nominal for member in members)
            if used > nominal:
                violations.append(f"{where}: members use {used} > their nominal {nominal}")
            borrowed = sum(member.borrowed for member in members)
            lendable = sum(member.unused_lendable for member in members)
            if borrowed > lendable:
                violations.append(f"{where}: borrowed {borrowed} > unused lendable {lendable}")
            lent = attribute_lending(members)
            for member in members:
                if lent[member.tenant] > member.limits.lendable:
                    violations.append(f"tenant {member.tenant} {resource}: lends "
                                      f"{lent[member.tenant]} > lending limit "
                                      f"{member.limits.lendable}")
    return violations
