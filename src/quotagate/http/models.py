"""Request bodies. Strict types: the domain validators judge the values (400),
pydantic only the shape (422), so ``"gpu": true`` is never taken for 1."""

from __future__ import annotations

from typing import Any, Literal

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


# The most requests one batch submit may carry (docs/decisions/309-batch-submit.md).
MAX_BATCH = 1000


class BatchSubmitBody(_Body):
    requests: list[SubmitBody] = Field(
        description=f"Up to {MAX_BATCH} submissions, each answered as a single submit would be",
        json_schema_extra={"maxItems": MAX_BATCH},
    )


class BatchEntry(BaseModel):
    status: int = Field(description="The status a single submit would have answered: "
                                    "202 new, 200 identical replay, or the error's status")
    request: dict[str, Any] | None = Field(default=None, description="The request (202, 200)")
    error: dict[str, Any] | None = Field(default=None, description="{code, message} (4xx, 5xx)")


class BatchAnswer(BaseModel):
    results: list[BatchEntry] = Field(description="One entry per submission, in order")


class ReleaseBody(_Body):
    reason: StrictStr | None = Field(default=None, max_length=1024)
    fencing_token: StrictInt | None = Field(
        default=None,
        description="Executor callbacks: the fencing token the delivery carried "
                    "(Quotagate-Fencing-Token); required with an executor token",
    )


class EndEntry(_Body):
    id: StrictStr = Field(description="The request id", examples=["job-1"])
    state: Literal["completed", "failed"] = Field(description="How the work ended")
    reason: StrictStr | None = Field(default=None, max_length=1024)
    fencing_token: StrictInt | None = Field(
        default=None, description="The fencing token the delivery carried; required with an "
        "executor token")


class BatchEndBody(_Body):
    ends: list[EndEntry] = Field(
        description=f"Up to {MAX_BATCH} ends, each answered as its single complete/fail would be",
        json_schema_extra={"maxItems": MAX_BATCH},
    )


class EndResult(BaseModel):
    status: int = Field(description="The status its single complete/fail would have answered")
    request: dict[str, Any] | None = Field(default=None, description="The request (200)")
    released: dict[str, int] | None = Field(default=None, description="Cost returned (200)")
    error: dict[str, Any] | None = Field(default=None, description="{code, message} (4xx, 5xx)")


class BatchEndAnswer(BaseModel):
    results: list[EndResult] = Field(description="One entry per end, in order")
