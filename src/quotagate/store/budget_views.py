"""Budgets as people read them: ``tenant show``, ``GET /v1/usage``, and ``check``.

What admission and release do with budgets is :mod:`quotagate.store.budgets`;
this module only reads (docs/fair-sharing.md#budgets).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from quotagate.domain.budget import BUCKET, format_duration, window_start
from quotagate.store import schema
from quotagate.store.budgets import reserved_by, running_requests
from quotagate.store.rows import decode_cost

__all__ = ["check", "describe", "describe_all"]


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 3)


def describe(connection: sa.Connection, tenant: str, now: float) -> dict[str, Any]:
    """``tenant show``'s budgets: per resource spent, reserved, left (resource-hours) and
    when the window next frees usage (``frees_at``, epoch seconds; None: nothing spent)."""
    budget, usage = schema.tenant_budget, schema.budget_usage
    rows = connection.execute(
        sa.select(budget).where(budget.c.tenant == tenant).order_by(budget.c.resource)
    ).mappings().all()
    settings = connection.execute(
        sa.select(schema.tenant.c.default_max_runtime, schema.tenant.c.stop_at_max_runtime,
                  schema.tenant.c.max_runtime_grace)
        .where(schema.tenant.c.name == tenant)).first()
    default, stops, grace = (None, False, 0) if settings is None else tuple(settings)
    described: dict[str, Any] = {"default_max_runtime": default,
                                 "stop_at_max_runtime": bool(stops),
                                 "max_runtime_grace": int(grace), "budget": {}}
    if not rows:
        return described
    running = running_requests(connection, tenant)
    for row in rows:
        resource, window = row["resource"], int(row["window_length"])
        first = window_start(now, window)
        closed = connection.execute(
            sa.select(usage.c.bucket, usage.c.amount)
            .where(usage.c.tenant == tenant, usage.c.resource == resource,
                   usage.c.bucket >= first)
            .order_by(usage.c.bucket)).all()
        spent = sum(float(amount) for _bucket, amount in closed)
        ahead = 0.0
        oldest = closed[0][0] if closed else None
        for request in running:
            amount = decode_cost(request.cost).get(resource, 0)
            if not amount or request.admitted is None:
                continue
            start = max(float(request.admitted), now - window)
            spent += amount * max(0.0, now - start)
            if request.reserved_runtime:
                ahead += amount * max(0.0, float(request.admitted) + request.reserved_runtime
                                      - now)
            began = int(float(request.admitted) // BUCKET) * BUCKET
            oldest = began if oldest is None else min(oldest, max(began, first))
        described["budget"][resource] = {
            "limit": f"{format_duration(row['amount'])}/{format_duration(window)}",
            "amount_hours": _hours(row["amount"]),
            "spent_hours": _hours(spent),
            "reserved_ahead_hours": _hours(ahead),
            "left_hours": _hours(max(0.0, row["amount"] - spent - ahead)),
            # The oldest usage counted leaves the window a window after its hour ends.
            "frees_at": None if oldest is None else float(oldest + BUCKET + window),
        }
    return described


def describe_all(connection: sa.Connection, now: float) -> list[dict[str, Any]]:
    """Every budget as :func:`describe` gives it, one row per (tenant, resource)."""
    tenants = connection.execute(sa.select(schema.tenant_budget.c.tenant).distinct()
                                 .order_by(schema.tenant_budget.c.tenant)).scalars().all()
    return [{"tenant": tenant, "resource": resource, **state}
            for tenant in tenants
            for resource, state in describe(connection, tenant, now)["budget"].items()]


def check(connection: sa.Connection) -> list[str]:
    """Budget rows against the requests and buckets: reserved and accrued recounted."""
    budget, usage = schema.tenant_budget, schema.budget_usage
    rows = connection.execute(sa.select(budget.c.tenant, budget.c.resource, budget.c.reserved,
                                        budget.c.accrued)).all()
    if not rows:
        return []
    reserved = reserved_by(running_requests(connection, None))
    totals = {(tenant, resource): int(total) for tenant, resource, total in connection.execute(
        sa.select(usage.c.tenant, usage.c.resource, sa.func.sum(usage.c.amount))
        .group_by(usage.c.tenant, usage.c.resource))}
    violations = []
    for tenant, resource, held, accrued in sorted(rows):
        expected = reserved.get((tenant, resource), 0)
        if int(held) != expected:
            violations.append(f"budget {tenant} {resource}: reserved {held} but running work "
                              f"reserves {expected}")
        total = totals.get((tenant, resource), 0)
        if int(accrued) != total:
            violations.append(f"budget {tenant} {resource}: accrued {accrued} but its usage "
                              f"buckets hold {total}")
    return violations
