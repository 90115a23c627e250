"""quotagate: a multi-tenant admission controller and quota ledger for shared compute."""

from quotagate.app import Quotagate
from quotagate.domain.clock import Clock, ManualClock, SystemClock
from quotagate.domain.model import Request, RequestState
from quotagate.domain.placement import Placement
from quotagate.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    QuotagateError,
    RateLimited,
    StaleGeneration,
    StoreUnavailable,
    Unauthorized,
)
from quotagate.store.ledger import ReleaseResult, SubmitResult

__all__ = [
    "Clock",
    "Conflict",
    "Forbidden",
    "InvalidInput",
    "ManualClock",
    "NotFound",
    "Placement",
    "Quotagate",
    "QuotagateError",
    "RateLimited",
    "ReleaseResult",
    "Request",
    "RequestState",
    "StaleGeneration",
    "StoreUnavailable",
    "SubmitResult",
    "SystemClock",
    "Unauthorized",
]
