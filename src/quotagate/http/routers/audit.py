"""The audit log: an admin reads everything, a tenant its own entries."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from quotagate.auth import authorizer as operations
from quotagate.domain.model import validate_name, validate_request_id
from quotagate.http.context import Context
from quotagate.http.security import CurrentActor, authorize
from quotagate.store.listing import MAX_PAGE

router = APIRouter(prefix="/v1", tags=["audit"])


@router.get("/audit", summary="Audit entries, newest first, with cursor pagination")
def get_audit(
    context: Context,
    actor: CurrentActor,
    tenant: Annotated[str | None, Query(description="Only this tenant's entries")] = None,
    request: Annotated[str | None, Query(
        description="Only the entries about this request (of its own tenant)")] = None,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> dict[str, Any]:
    scope = tenant if tenant is not None or actor.admin else actor.tenant
    authorize(context, actor, scope, operations.AUDIT_READ)
    if scope is not None:
        validate_name(scope, "tenant")
    if request is not None:
        validate_request_id(request)
    # A tenant's token stays in its scope: another tenant's request gives no entries.
    page = context.gate.list_audit(tenant=scope, request=request, cursor=cursor, limit=limit)
    return {"entries": page.items, "next_cursor": page.next_cursor}
