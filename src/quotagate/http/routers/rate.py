"""Rate quotas over HTTP: a tenant's token bucket, its top-ups, and 429's headers.

``PUT /v1/tenants/{tenant}/rate`` shapes the bucket, ``DELETE`` removes it,
``GET`` shows the tokens left, ``POST /v1/tenants/{tenant}/tokens``
``{"add": 3}`` tops it up. Shaping and top-ups are admin operations (a
tenant must not refill itself); a tenant token may read its own bucket.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter

from quotagate.auth import authorizer as operations
from quotagate.domain.model import validate_name
from quotagate.errors import RateLimited
from quotagate.http.context import Context
from quotagate.http.models import RateBody, TokensBody
from quotagate.http.security import CurrentActor, authorize

router = APIRouter(prefix="/v1/tenants/{tenant}", tags=["rate quotas"])


def rate_view(status: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the API shows of a bucket: its shape and the tokens left."""
    if status is None:
        return None
    return {"capacity": status["capacity"], "refill_per_second": status["refill_per_second"],
            "tokens": status["tokens"]}


def rate_limit_headers(error: RateLimited) -> dict[str, str]:
    """``RateLimit-Limit/-Remaining/-Reset`` for a 429 (draft-ietf-httpapi-ratelimit-headers)."""
    headers: dict[str, str] = {}
    capacity = error.fields.get("capacity")
    tokens_left = error.fields.get("tokens_left")
    if isinstance(capacity, int | float) and math.isfinite(capacity):
        headers["RateLimit-Limit"] = str(int(capacity))
    if isinstance(tokens_left, int | float) and math.isfinite(tokens_left):
        headers["RateLimit-Remaining"] = str(max(0, math.floor(tokens_left)))
    if math.isfinite(error.retry_after):
        headers["RateLimit-Reset"] = str(max(1, math.ceil(error.retry_after)))
    return headers


@router.get("/rate", summary="A tenant's rate quota and the tokens left")
def get_rate(tenant: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TENANT_READ)
    validate_name(tenant, "tenant")
    return {"tenant": tenant, "rate": rate_view(context.gate.rate_status(tenant))}


@router.put("/rate", summary="Give a tenant a rate quota or reshape it (admin)")
def put_rate(
    tenant: str, body: RateBody, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TENANT_SET)
    status = context.gate.set_rate(tenant, body.config(), actor=actor.name)
    return {"tenant": tenant, "rate": rate_view(status)}


@router.delete("/rate", summary="Remove a tenant's rate quota (admin)")
def delete_rate(tenant: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TENANT_SET)
    context.gate.set_rate(tenant, None, actor=actor.name)
    return {"tenant": tenant, "rate": None}


@router.post("/tokens", summary="Top up a tenant's rate quota (admin)")
def add_tokens(
    tenant: str, body: TokensBody, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TENANT_SET)
    status = context.gate.add_tokens(tenant, body.add, actor=actor.name)
    return {"tenant": tenant, "rate": rate_view(status)}
