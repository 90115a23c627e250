"""What every route needs, built once per app and reached through a dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from quotagate.app import Quotagate
from quotagate.auth.authorizer import Authorizer
from quotagate.auth.tokens import TokenStore
from quotagate.observability.metrics import Metrics
from quotagate.store.group_release import GroupRelease


@dataclass(frozen=True)
class ApiContext:
    gate: Quotagate
    tokens: TokenStore
    authorizer: Authorizer
    metrics: Metrics
    # complete/fail/cancel calls, written together (callbacks come in bursts)
    releases: GroupRelease


async def get_context(request: Request) -> ApiContext:
    # async: FastAPI runs a plain-def dependency in the thread pool, one more
    # hand-off per call for what is an attribute read.
    context: ApiContext = request.app.state.context
    return context


Context = Annotated[ApiContext, Depends(get_context)]
