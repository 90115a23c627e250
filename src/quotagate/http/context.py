"""What every route needs, built once per app and reached through a dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from quotagate.app import Quotagate
from quotagate.auth.authorizer import Authorizer
from quotagate.auth.tokens import TokenStore
from quotagate.observability.metrics import Metrics


@dataclass(frozen=True)
class ApiContext:
    gate: Quotagate
    tokens: TokenStore
    authorizer: Authorizer
    metrics: Metrics


def get_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.context
    return context


Context = Annotated[ApiContext, Depends(get_context)]
