"""``create_app``: the FastAPI application over one :class:`~quotagate.app.Quotagate`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI

from quotagate.app import Quotagate
from quotagate.auth.authorizer import Authorizer, default_authorizer
from quotagate.http.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from quotagate.http.context import ApiContext
from quotagate.http.errors import install_error_handlers
from quotagate.http.hot_routes import HotRoutes
from quotagate.http.openapi import API_ERRORS, PROBE_ERRORS, constrain_parameters, whole_bounds
from quotagate.http.routers import admin, audit, dashboard, health, rate, requests, streams
from quotagate.http.strict_query import refuse_unknown_query_parameters
from quotagate.observability.metrics import Metrics
from quotagate.store.group_release import GroupRelease

# Every router the API serves. A new area adds one line here.
ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    admin.router,
    requests.router,
    requests.batch_router,
    audit.router,
    rate.router,
    streams.router,
    dashboard.router,
)


def create_app(
    gate: Quotagate,
    *,
    authorizer: Authorizer | None = None,
    metrics: Metrics | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The HTTP API for ``gate``; ``authorizer`` replaces the default (admin / own tenant) rule."""
    app = FastAPI(
        title="quotagate",
        version="1",
        description="Multi-tenant admission controller and quota ledger. "
        "Authenticate with `Authorization: Bearer <token>` (`quotagate api-token create`).",
        openapi_url="/openapi.json",
    )
    context = app.state.context = ApiContext(
        gate=gate,
        authorizer=authorizer or default_authorizer,
        metrics=metrics or gate.metrics,
        releases=GroupRelease(gate.release_many),
    )
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router, responses=PROBE_ERRORS if router is health.router
                           else API_ERRORS,
                           dependencies=[Depends(refuse_unknown_query_parameters)])
    _state_constraints(app)
    dashboard.mount_ui(app)
    # Submits and callbacks skip FastAPI's routing (http/hot_routes.py); the body
    # limit, added last, is outside it.
    app.add_middleware(HotRoutes, context=context)
    app.add_middleware(BodyLimitMiddleware, limit=max_body_bytes)
    return app


def _state_constraints(app: FastAPI) -> None:
    """Serve the generated document with the parameter constraints the API enforces."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = whole_bounds(constrain_parameters(generate()))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
