"""Tenants, their quotas, pools and their capacities."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import validate_amounts, validate_name
from quotagate.domain.sharing import KEEP, Keep, TenantSharing
from quotagate.errors import Conflict, NotFound, quoted
from quotagate.store import budget_views, budgets, cohorts, fair_history, pool_slices, schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.budgets import BudgetChange
from quotagate.store.dialect import reading, run_transaction
from quotagate.store.rows import holder_usage


class Configuration:
    """Admin changes: each one transaction, each one audit entry."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or SystemClock()

    def set_tenant(
        self, name: str, quota: Mapping[str, object], *, actor: str = "admin",
        sharing: TenantSharing | None = None, budget: BudgetChange | None = None,
    ) -> dict[str, dict[str, int]]:
        """Create the tenant if needed and set the caps it names; others stay as they are.

        A cap below current use is allowed: it blocks new admissions until use falls.
        ``sharing`` changes its cohort, limits and weight (docs/fair-sharing.md);
        ``budget`` its budgets and default max-runtime, in the same transaction.
        """
        validate_name(name, "tenant")
        caps = validate_amounts(quota, what="quota", allow_zero=True) if quota else {}
        change = sharing or TenantSharing()
        if isinstance(change.cohort, str):
            validate_name(change.cohort, "cohort")
        return self._set(schema.tenant, schema.tenant_quota, "tenant", name, caps, actor,
                         change, budget=budget)

    def set_cohort(
        self, name: str, *, parent: str | Keep | None = KEEP, actor: str = "admin"
    ) -> dict[str, Any]:
        """Create a cohort or move it under another (None: make it a root)."""
        validate_name(name, "cohort")
        if isinstance(parent, str):
            validate_name(parent, "cohort")

        def work(connection: sa.Connection) -> dict[str, Any]:
            now = self.clock.now()
            chosen, created = cohorts.set_cohort(connection, name, parent, now)
            record(connection, now, AuditEntry(
                actor, "cohort.set", "created" if created else "ok", None, f"cohort/{name}",
                f"parent={chosen or 'none'}"))
            return cohorts.describe_cohort(connection, name)

        for _ in range(3):
            try:
                return run_transaction(self.engine, work)
            except IntegrityError:
                continue
        raise Conflict(f"cohort {quoted(name)} is being changed concurrently; retry")

    def get_cohort(self, name: str) -> dict[str, Any]:
        with reading(self.engine) as connection:
            return cohorts.describe_cohort(connection, name)

    def set_fair_share(self, half_life: int | None, *, actor: str = "admin") -> dict[str, Any]:
        """Set or remove the ledger-wide fair-share half-life (docs/decisions/712)."""

        def work(connection: sa.Connection) -> dict[str, Any]:
            fair_history.set_half_life(connection, half_life)
            record(connection, self.clock.now(), AuditEntry(
                actor, "fair_share.set", "ok", None, "fair-share",
                f"half_life={'none' if half_life is None else half_life}"))
            return {"half_life": half_life}

        return run_transaction(self.engine, work)

    def fair_share(self) -> dict[str, Any]:
        with reading(self.engine) as connection:
            return {"half_life": fair_history.half_life(connection)}

    def set_pool(
        self, name: str, capacity: Mapping[str, object], *, actor: str = "admin",
        slices: int | None = None,
    ) -> dict[str, dict[str, int]]:
        """Create the pool if needed, set the caps it names and, given, its slice count.

        Every cap is spread over the pool's capacity slices
        (docs/decisions/029-capacity-slices.md); one slice unless set.
        """
        validate_name(name, "pool")
        caps = validate_amounts(capacity, what="capacity", allow_zero=True) if capacity else {}
        if slices is not None:
            slices = pool_slices.validate_slices(slices)
        return self._set(schema.pool, schema.pool_capacity, "pool", name, caps, actor,
                         slices=slices)

    def _set(
        self,
        holder_table: sa.Table,
        cap_table: sa.Table,
        holder: str,
        name: str,
        caps: dict[str, int],
        actor: str,
        sharing: TenantSharing | None = None,
        slices: int | None = None,
        budget: BudgetChange | None = None,
    ) -> dict[str, dict[str, int]]:
        def work(connection: sa.Connection) -> dict[str, dict[str, int]]:
            now = self.clock.now()
            columns = [holder_table.c.name]
            if sharing is not None:
                columns.append(holder_table.c.cohort)
            exists = connection.execute(
                sa.select(*columns).where(holder_table.c.name == name).with_for_update()
            ).first()
            if exists is None:
                connection.execute(holder_table.insert().values(name=name, created=now))
            if holder == "pool":
                pool_slices.configure(connection, name, caps, slices)
            else:
                # The caps it names and the sharing change rewrite some or all of the
                # tenant's rows: all are taken in admission's order first.
                cohorts.lock_quota_rows(connection, [name])
                for resource, cap in caps.items():
                    updated = connection.execute(
                        cap_table.update()
                        .where(cap_table.c[holder] == name, cap_table.c.resource == resource)
                        .values(cap=cap)
                    )
                    if updated.rowcount == 0:
                        connection.execute(
                            cap_table.insert().values(
                                {holder: name, "resource": resource, "cap": cap, "used": 0}
                            )
                        )
            change = ",".join(f"{resource}={cap}" for resource, cap in caps.items())
            if slices is not None:
                change = ",".join(part for part in (change, f"slices={slices}") if part)
            if sharing is not None:
                old_cohort = None if exists is None else exists[1]
                if sharing or old_cohort is not None:
                    cohorts.apply_tenant_sharing(connection, name, sharing, old_cohort)
                change = ",".join(part for part in (change, sharing.describe()) if part)
            if budget is not None:
                budgets.apply(connection, name, budget)
                change = ",".join(part for part in (change, budget.describe()) if part)
            record(
                connection,
                now,
                AuditEntry(actor, f"{holder}.set", "ok",
                           name if holder == "tenant" else None, f"{holder}/{name}", change),
            )
            return self._describe(connection, cap_table, holder, name)

        for _ in range(3):
            try:
                return run_transaction(self.engine, work)
            except IntegrityError:
                continue  # created concurrently by another admin; run again as an update
        raise Conflict(f"{holder} {quoted(name)} is being changed concurrently; retry")

    @staticmethod
    def _describe(
        connection: sa.Connection, cap_table: sa.Table, holder: str, name: str
    ) -> dict[str, dict[str, int]]:
        usage = holder_usage(connection, cap_table, holder, name)
        return {resource: {"used": used, "cap": cap} for resource, (used, cap) in usage.items()}

    def get_tenant(self, name: str) -> dict[str, Any]:
        described = self._get(schema.tenant, schema.tenant_quota, "tenant", name)
        with reading(self.engine) as connection:
            described.update(cohorts.describe_member(connection, name, described["quota"]))
            described.update(budget_views.describe(connection, name, self.clock.now()))
        return described

    def get_pool(self, name: str) -> dict[str, Any]:
        described = self._get(schema.pool, schema.pool_capacity, "pool", name)
        with reading(self.engine) as connection:
            described["slices"] = pool_slices.slice_count(connection, name)
        return described

    def _get(
        self, holder_table: sa.Table, cap_table: sa.Table, holder: str, name: str
    ) -> dict[str, Any]:
        with reading(self.engine) as connection:
            row = connection.execute(
                sa.select(holder_table).where(holder_table.c.name == name)
            ).mappings().first()
            if row is None:
                raise NotFound(f"{holder} {quoted(name)} does not exist", code=f"unknown_{holder}")
            resources = self._describe(connection, cap_table, holder, name)
        key = "quota" if holder == "tenant" else "capacity"
        return {"name": name, "created": row["created"], key: resources}

    def list_tenants(self) -> list[str]:
        with reading(self.engine) as connection:
            return list(connection.execute(sa.select(schema.tenant.c.name).order_by("name")).scalars())

    def list_cohorts(self) -> list[tuple[str, str | None]]:
        """Every cohort with its parent, by name."""
        with reading(self.engine) as connection:
            return sorted(cohorts.cohort_parents(connection).items())

    def list_pools(self) -> list[str]:
        with reading(self.engine) as connection:
            return list(connection.execute(sa.select(schema.pool.c.name).order_by("name")).scalars())
