"""The dashboard's endpoints, made for the page at ``/ui/`` and for ``quotagate top``.

One call answers a whole poll (one query per view, not one per row); an admin
sees every tenant, a tenant token only its own (the authorizer decides, as for
every other route). See docs/dashboard.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from quotagate.auth import authorizer as operations
from quotagate.domain.model import validate_name, validate_request_id
from quotagate.http.context import Context
from quotagate.http.security import CurrentActor, authorize

router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"])

UI_DIRECTORY = Path(__file__).resolve().parent.parent / "ui"
# The page loads only its own files and talks only to its own origin.
_UI_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@router.get("", summary="Everything the dashboard shows, in one call")
def get_dashboard(
    context: Context,
    actor: CurrentActor,
    tenant: Annotated[str | None, Query(description="Only this tenant (admins)")] = None,
) -> dict[str, Any]:
    scope = tenant if tenant is not None or actor.admin else actor.tenant
    authorize(context, actor, scope, operations.USAGE_READ)
    if scope is not None:
        validate_name(scope, "tenant")
    if tenant is not None:
        # Named on purpose, so a misspelt one is 404 unknown_tenant, not empty views. A
        # tenant token's own scope is not checked: it may be made before its tenant.
        context.gate.tenant(tenant)
    data = context.gate.dashboard(scope, operator=actor.admin).to_dict()
    data["admin"] = actor.admin
    return data


@router.get("/requests/{tenant}/{request_id}", summary="A request's whole story")
def get_story(
    tenant: str, request_id: str, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.REQUEST_READ, request_id=request_id)
    validate_name(tenant, "tenant")
    validate_request_id(request_id)
    return context.gate.request_story(request_id, tenant=tenant, operator=actor.admin)


class _UiFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_UI_HEADERS)
        return response


def mount_ui(app: FastAPI) -> None:
    """Serve the page's files, shipped inside the package: no CDN, no build step."""
    app.mount("/ui", _UiFiles(directory=UI_DIRECTORY, html=True), name="ui")
