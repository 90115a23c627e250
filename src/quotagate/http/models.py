"""Request bodies. Strict types: the domain validators judge the values (400),
pydantic only the shape (422), so ``"gpu": true`` is never taken for 1."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from quotagate.domain.bucket import BucketConfig


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateBody(_Body):
    capacity: StrictInt = Field(description="Tokens the bucket holds when full", examples=[5])
    refill_per_second: StrictInt | StrictFloat = Field(
        default=0, description="Tokens gained per second; 0: only top-ups refill it",
        examples=[0, 0.5],
    )

    def config(self) -> BucketConfig:
        """The domain judges the values (400); pydantic only the shape (422)."""
        return BucketConfig(self.capacity, self.refill_per_second)


class TokensBody(_Body):
    add: StrictInt = Field(description="Tokens to add (never above the capacity)", examples=[3])


class TenantBody(_Body):
    quota: dict[StrictStr, StrictInt] = Field(
        default_factory=dict, description="Cap per resource, e.g. {\"gpu\": 2}",
        examples=[{"gpu": 2}],
    )
    rate: RateBody | None = Field(
        default=None, description="Rate quota (token bucket); null removes it, absent keeps it",
        examples=[{"capacity": 5, "refill_per_second": 0}],
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
