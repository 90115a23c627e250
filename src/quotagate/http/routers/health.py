"""Liveness, readiness and the Prometheus scrape."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Response

from quotagate.errors import StoreUnavailable
from quotagate.http.context import Context
from quotagate.observability.metrics import CONTENT_TYPE

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The ledger database answers")
def readyz(context: Context) -> dict[str, str]:
    try:
        context.gate.ping()
    except sa.exc.SQLAlchemyError as error:
        raise StoreUnavailable("the ledger database cannot be reached") from error
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(context: Context) -> Response:
    return Response(context.metrics.exposition(), media_type=CONTENT_TYPE)
