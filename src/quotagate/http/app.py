"""``create_app``: the FastAPI application over one :class:`~quotagate.app.Quotagate`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from quotagate.app import Quotagate
from quotagate.auth.authorizer import Authorizer, default_authorizer
from quotagate.auth.tokens import TokenStore
from quotagate.http.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from quotagate.http.context import ApiContext
from quotagate.http.errors import install_error_handlers
from quotagate.http.routers import admin, audit, dashboard, health, rate, requests, streams
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
        "Authenticate with `Authorization: Bearer <token>` (`quotagate token create`).",
        openapi_url="/openapi.json",
    )
    app.state.context = ApiContext(
        gate=gate,
        tokens=TokenStore(gate.engine, clock=gate.clock),
        authorizer=authorizer or default_authorizer,
        metrics=metrics or Metrics(gate.engine, clock=gate.clock),
        releases=GroupRelease(gate.release_many),
    )
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    dashboard.mount_ui(app)
    app.add_middleware(BodyLimitMiddleware, limit=max_body_bytes)
    return app
