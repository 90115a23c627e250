"""Request bodies. Strict types: the domain validators judge the values (400),
pydantic only the shape (422), so ``"gpu": true`` is never taken for 1."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TenantBody(_Body):
    quota: dict[StrictStr, StrictInt] = Field(
        default_factory=dict, description="Cap per resource, e.g. {\"gpu\": 2}",
        examples=[{"gpu": 2}],
    )


class PoolBody(_Body):
    capacity: dict[StrictStr, StrictInt] = Field(
        default_factory=dict, description="Capacity per resource, e.g. {\"gpu\": 4}",
        examples=[{"gpu": 4}],
    )


class SubmitBody(_Body):
    id: StrictStr = Field(description="Stable request id: the idempotency key", examples=["job-1"])
    cost: dict[StrictStr, StrictInt] = Field(description="Amount per resource",
                                             examples=[{"gpu": 1}])
    priority: StrictInt = 0
    payload: Any = Field(default=None, description="JSON handed to the executor")
    target: StrictStr | None = Field(default=None, description="Delivery target name")


class ReleaseBody(_Body):
    reason: StrictStr | None = Field(default=None, max_length=1024)
