"""What every route needs, built once per app and reached through a dependency."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from quotagate.app import Quotagate
from quotagate.auth.authorizer import Authorizer
from quotagate.auth.refusals import RefusalThrottle
from quotagate.observability.metrics import Metrics
from quotagate.store.group_release import GroupRelease


@dataclass(frozen=True)
class ApiContext:
    gate: Quotagate
    authorizer: Authorizer
    metrics: Metrics
    # complete/fail/cancel calls, written together (callbacks come in bursts)
    releases: GroupRelease
    # At most one audit row per actor and operation per minute for 403s.
    refusals: RefusalThrottle = field(default_factory=RefusalThrottle)


async def get_context(request: Request) -> ApiContext:
    # async: FastAPI runs a plain-def dependency in the thread pool, one more
    # hand-off per call for what is an attribute read.
    context: ApiContext = request.app.state.context
    return context


Context = Annotated[ApiContext, Depends(get_context)]
