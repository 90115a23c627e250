"""quotagate: a multi-tenant admission controller and quota ledger for shared compute."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from quotagate.app import Quotagate
    from quotagate.store.ledger import ReleaseResult, SubmitResult

# The facade and the ledger's results load SQLAlchemy and every store: they are imported on
# first use, so that importing a submodule (the CLI's `--help`, quotagate.errors) does not
# pay for them. `from quotagate import Quotagate` works as before.
_LAZY = {
    "Quotagate": "quotagate.app",
    "ReleaseResult": "quotagate.store.ledger",
    "SubmitResult": "quotagate.store.ledger",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'quotagate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
