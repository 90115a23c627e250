"""Tenants, pools and usage: changes need an admin token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter

from quotagate.auth import authorizer as operations
from quotagate.domain.model import validate_name
from quotagate.domain.sharing import KEEP
from quotagate.errors import InvalidInput, QuotagateError, with_hint
from quotagate.http.context import Context
from quotagate.http.models import CohortBody, FairShareBody, PoolBody, TenantBody
from quotagate.http.routers.rate import rate_view
from quotagate.http.security import CurrentActor, authorize

router = APIRouter(prefix="/v1", tags=["admin"])


@router.put("/tenants/{tenant}", summary="Create a tenant or change its quotas (admin)")
def put_tenant(
    tenant: str, body: TenantBody, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TENANT_SET)
    rate = body.rate.config() if body.rate is not None else None  # judged before any change
    if rate is not None:
        context.gate.check_rate_store(tenant, rate)  # a store that is down changes nothing
    try:
        context.gate.set_tenant(
            tenant, body.quota, actor=actor.name,
            cohort=body.cohort if "cohort" in body.model_fields_set else KEEP,
            borrowing_limit=body.borrowing_limit, lending_limit=body.lending_limit,
            weight=body.weight,
            max_priority=body.max_priority if "max_priority" in body.model_fields_set else KEEP,
            reclaim=body.reclaim, within_tenant=body.within_tenant, on_preempt=body.on_preempt,
            budget=body.budget,
            default_max_runtime=body.default_max_runtime
            if "default_max_runtime" in body.model_fields_set else KEEP,
            stop_at_max_runtime=body.stop_at_max_runtime,
            max_runtime_grace=body.max_runtime_grace,
        )
    except InvalidInput as refused:
        raise with_hint(refused, _FIELDS) from None
    if "rate" in body.model_fields_set:
        context.gate.set_rate(tenant, rate, actor=actor.name)
    return _tenant(context, tenant)


# The body field that sets what a cohort refusal lacks (the CLI names its options).
_FIELDS: dict[str, Callable[[QuotagateError], str]] = {
    "not_in_cohort": lambda _refused: 'set "cohort"',
    "unknown_quota_resource": lambda refused: f'set "quota": {{"{refused.fields["resource"]}": N}}',
}


@router.get("/tenants/{tenant}", summary="A tenant's quotas and use")
def get_tenant(tenant: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TENANT_READ)
    validate_name(tenant, "tenant")
    return _tenant(context, tenant)


def _tenant(context: Context, tenant: str) -> dict[str, Any]:
    """A tenant's quotas and use, with its rate quota and the tokens left (or null)."""
    described = context.gate.tenant(tenant)
    described["rate"] = rate_view(context.gate.rate_status(tenant))
    return described


@router.put("/cohorts/{cohort}", summary="Create a cohort or move it in the tree (admin)")
def put_cohort(
    cohort: str, body: CohortBody, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, None, operations.COHORT_SET)
    parent = body.parent if "parent" in body.model_fields_set else KEEP
    return context.gate.set_cohort(cohort, parent=parent, actor=actor.name)


@router.get("/cohorts/{cohort}", summary="A cohort: parent, children, tenants, room (admin)")
def get_cohort(cohort: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, None, operations.COHORT_READ)
    validate_name(cohort, "cohort")
    return context.gate.config.get_cohort(cohort)


@router.put("/fair-share", summary="Set the ledger's fair-share half-life (admin)")
def put_fair_share(body: FairShareBody, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, None, operations.FAIR_SHARE_SET)
    return context.gate.set_fair_share(half_life=body.half_life, actor=actor.name)


@router.get("/fair-share", summary="The ledger's fair-share settings (admin)")
def get_fair_share(context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, None, operations.FAIR_SHARE_READ)
    return context.gate.fair_share()


@router.put("/pools/{pool}", summary="Create a pool or change its capacity (admin)")
def put_pool(pool: str, body: PoolBody, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, None, operations.POOL_SET)
    context.gate.set_pool(pool, body.capacity, actor=actor.name, slices=body.slices)
    return context.gate.pool(pool)


@router.get("/pools/{pool}", summary="A pool's capacity and use (admin)")
def get_pool(pool: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, None, operations.POOL_READ)
    validate_name(pool, "pool")
    return context.gate.pool(pool)


@router.get("/usage", summary="Used and cap per tenant and pool resource; nominal, borrowed "
            "and lent per tenant; the shared room of each cohort; budgets")
def get_usage(context: Context, actor: CurrentActor) -> dict[str, list[dict[str, Any]]]:
    authorize(context, actor, None, operations.USAGE_READ)
    usage = context.gate.usage()
    # A tenant sees its own quotas, and the pools everyone shares; other tenants'
    # cohorts are not its business (its own rows say what it borrows).
    tenants = [row for row in usage["tenants"] if actor.admin or row["tenant"] == actor.tenant]
    cohorts = usage.get("cohorts", []) if actor.admin else []
    budgets = [row for row in usage.get("budgets", [])
               if actor.admin or row["tenant"] == actor.tenant]
    return {"tenants": [dict(row) for row in tenants], "pools": [dict(row) for row in usage["pools"]],
            "cohorts": [dict(row) for row in cohorts], "budgets": budgets}
