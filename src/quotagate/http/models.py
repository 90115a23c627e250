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
    cohort: StrictStr | None = Field(
        default=None, description="The cohort it lends to and borrows from; null leaves it, "
        "absent keeps it (docs/fair-sharing.md)", examples=["research"],
    )
    borrowing_limit: dict[StrictStr, StrictInt | None] = Field(
        default_factory=dict, description="How far above its quota it may borrow, per "
        "resource; null removes the limit", examples=[{"gpu": 2}],
    )
    lending_limit: dict[StrictStr, StrictInt | None] = Field(
        default_factory=dict, description="How much of its unused quota it lends, per "
        "resource; null removes the limit (it lends all)", examples=[{"gpu": 1}],
    )
    weight: StrictInt | None = Field(
        default=None, description="Its weight in fair sharing between tenants (1-1000)",
        examples=[1],
    )
    max_priority: StrictInt | None = Field(
        default=None, description="The highest priority its requests may ask for; null "
        "removes the cap, absent keeps it", examples=[100],
    )
    reclaim: StrictStr | None = Field(
        default=None, description="Preempt borrowed work to get back to its nominal share: "
        "never, lower-priority or any", examples=["any"],
    )
    within_tenant: StrictStr | None = Field(
        default=None, description="Preempt its own lower-priority work: never or "
        "lower-priority", examples=["lower-priority"],
    )


class CohortBody(_Body):
    parent: StrictStr | None = Field(
        default=None, description="The parent cohort; null makes it a root, absent keeps it "
        "(a new cohort: a root)", examples=["org"],
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
