"""Request bodies. Strict types: the domain validators judge the values (400),
pydantic only the shape (422), so ``"gpu": true`` is never taken for 1 nor
``"1"`` for a number. A JSON number with a zero fraction (``1.0``) is a whole
number, as JSON Schema says (docs/decisions/805-openapi-states-the-constraints.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictStr

from quotagate.domain.bucket import MAX_CAPACITY, MAX_REFILL_PER_SECOND, BucketConfig
from quotagate.domain.budget import BUDGET_PATTERN, MAX_GRACE, MAX_RUNTIME
from quotagate.domain.model import (
    MAX_AMOUNT,
    MAX_PRIORITY,
    MAX_WEIGHT,
    NAME_PATTERN,
    ON_PREEMPT_POLICIES,
    RECLAIM_POLICIES,
    REQUEST_ID_PATTERN,
    RESOURCE_PATTERN,
    WITHIN_TENANT_POLICIES,
)
from quotagate.domain.slices import MAX_SLICES


def _whole_number(value: object) -> object:
    # bool is an int subclass and JSON's true is not 1; 2.0 is 2 (JSON Schema's integer).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError("must be a whole number")


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]

# Constraints the domain validators enforce (400 with their own codes), stated in
# the OpenAPI document only: pydantic checks the shape (422), not these values.


def _amounts(minimum: int) -> dict[str, Any]:
    return {"propertyNames": {"pattern": f"^{RESOURCE_PATTERN}$", "maxLength": 32},
            "additionalProperties": {"type": "integer", "minimum": minimum,
                                     "maximum": MAX_AMOUNT}}


def _limits() -> dict[str, Any]:
    # A limit per resource, or null to remove it.
    return {"propertyNames": {"pattern": f"^{RESOURCE_PATTERN}$", "maxLength": 32},
            "additionalProperties": {"anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT}, {"type": "null"}]}}


_NAME: dict[str, Any] = {"pattern": f"^{NAME_PATTERN}$", "maxLength": 63}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateBody(_Body):
    capacity: WholeNumber = Field(description="Tokens the bucket holds when full", examples=[5],
                                json_schema_extra={"minimum": 1, "maximum": int(MAX_CAPACITY)})
    refill_per_second: WholeNumber | StrictFloat = Field(
        default=0, description="Tokens gained per second; 0: only top-ups refill it",
        examples=[0, 0.5],
        json_schema_extra={"minimum": 0, "maximum": MAX_REFILL_PER_SECOND},
    )

    def config(self) -> BucketConfig:
        """The domain judges the values (400); pydantic only the shape (422)."""
        return BucketConfig(self.capacity, self.refill_per_second)


class TokensBody(_Body):
    add: WholeNumber = Field(description="Tokens to add (never above the capacity)", examples=[3],
                           json_schema_extra={"minimum": 1, "maximum": int(MAX_CAPACITY)})


class TenantBody(_Body):
    quota: dict[StrictStr, WholeNumber] = Field(
        default_factory=dict, description="Cap per resource, e.g. {\"gpu\": 2}",
        examples=[{"gpu": 2}], json_schema_extra=_amounts(0),
    )
    rate: RateBody | None = Field(
        default=None, description="Rate quota (token bucket); null removes it, absent keeps it",
        examples=[{"capacity": 5, "refill_per_second": 0}],
    )
    cohort: StrictStr | None = Field(
        default=None, description="The cohort it lends to and borrows from; null leaves it, "
        "absent keeps it (docs/fair-sharing.md)", examples=["research"],
        json_schema_extra=_NAME,
    )
    borrowing_limit: dict[StrictStr, WholeNumber | None] = Field(
        default_factory=dict, description="How far above its quota it may borrow, per "
        "resource; null removes the limit", examples=[{"gpu": 2}],
        json_schema_extra=_limits(),
    )
    lending_limit: dict[StrictStr, WholeNumber | None] = Field(
        default_factory=dict, description="How much of its unused quota it lends, per "
        "resource; null removes the limit (it lends all)", examples=[{"gpu": 1}],
        json_schema_extra=_limits(),
    )
    weight: WholeNumber | None = Field(
        default=None, description="Its weight in fair sharing between tenants (1-1000)",
        examples=[1], json_schema_extra={"minimum": 1, "maximum": MAX_WEIGHT},
    )
    max_priority: WholeNumber | None = Field(
        default=None, description="The highest priority its requests may ask for; null "
        "removes the cap, absent keeps it", examples=[100],
        json_schema_extra={"minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY},
    )
    reclaim: StrictStr | None = Field(
        default=None, description="Preempt borrowed work to get back to its nominal share: "
        "never, lower-priority or any", examples=["any"],
        json_schema_extra={"enum": [*RECLAIM_POLICIES, None]},
    )
    within_tenant: StrictStr | None = Field(
        default=None, description="Preempt its own lower-priority work: never or "
        "lower-priority", examples=["lower-priority"],
        json_schema_extra={"enum": [*WITHIN_TENANT_POLICIES, None]},
    )
    budget: dict[StrictStr, StrictStr | None] = Field(
        default_factory=dict, description="Resource-time per rolling window, per resource, "
        "e.g. {\"gpu\": \"100h/30d\"}; null removes that budget (docs/fair-sharing.md#budgets)",
        examples=[{"gpu": "100h/30d"}],
        json_schema_extra={"propertyNames": {"pattern": f"^{RESOURCE_PATTERN}$", "maxLength": 32},
                           "additionalProperties": {"anyOf": [
                               {"type": "string", "pattern": f"^{BUDGET_PATTERN}$"},
                               {"type": "null"}]}},
    )
    default_max_runtime: WholeNumber | None = Field(
        default=None, description="Seconds a budget reserves for its requests that declare no "
        "max_runtime; null removes it, absent keeps it", examples=[3600],
        json_schema_extra={"minimum": 1, "maximum": MAX_RUNTIME},
    )
    on_preempt: StrictStr | None = Field(
        default=None, description="What becomes of its preempted work: fail (it ends "
        "preempted) or requeue (it waits again, with its submission time)",
        examples=["requeue"], json_schema_extra={"enum": [*ON_PREEMPT_POLICIES, None]},
    )
    stop_at_max_runtime: StrictBool | None = Field(
        default=None, description="Stop its running work once its max-runtime has passed "
        "since admission (it ends timed_out, through the confirmed stop); false: such work "
        "keeps running and its budget accrues it; absent or null keeps the setting",
        examples=[True],
    )
    max_runtime_grace: WholeNumber | None = Field(
        default=None, description="Seconds past its max-runtime that work may run before the "
        "stop of stop_at_max_runtime begins (0: none, the default); not a process target's "
        "stop_grace, which comes after the stop began (docs/decisions/715); absent or null "
        "keeps it", examples=[300],
        json_schema_extra={"minimum": 0, "maximum": MAX_GRACE},
    )


class CohortBody(_Body):
    parent: StrictStr | None = Field(
        default=None, description="The parent cohort; null makes it a root, absent keeps it "
        "(a new cohort: a root)", examples=["org"], json_schema_extra=_NAME,
    )


class FairShareBody(_Body):
    half_life: WholeNumber | None = Field(
        description="Seconds: each tenant's past use, halved every half-life, is blended into "
        "its fair share; null: current use only (docs/fair-sharing.md#half-life)",
        examples=[3600], json_schema_extra={"minimum": 1, "maximum": MAX_RUNTIME},
    )


class PoolBody(_Body):
    capacity: dict[StrictStr, WholeNumber] = Field(
        default_factory=dict, description="Capacity per resource, e.g. {\"gpu\": 4}",
        examples=[{"gpu": 4}], json_schema_extra=_amounts(0),
    )
    slices: WholeNumber | None = Field(
        default=None, description="Capacity slices the caps are split over, so that many "
        "admitters charge the pool on different rows (1-64); absent keeps it. Fewer is "
        "refused (409 slice_in_use) while a slice that would go is in use",
        examples=[4], json_schema_extra={"minimum": 1, "maximum": MAX_SLICES},
    )


class SubmitBody(_Body):
    id: StrictStr = Field(description="Stable request id: the idempotency key", examples=["job-1"],
                          json_schema_extra={"pattern": f"^{REQUEST_ID_PATTERN}$",
                                             "maxLength": 128})
    cost: dict[StrictStr, WholeNumber] = Field(description="Amount per resource",
                                             examples=[{"gpu": 1}],
                                             json_schema_extra={**_amounts(1), "minProperties": 1})
    priority: WholeNumber = Field(default=0, description="Higher first; waiting adds to it",
                                json_schema_extra={"minimum": -MAX_PRIORITY,
                                                   "maximum": MAX_PRIORITY})
    payload: Any = Field(default=None, description="JSON handed to the executor (at most 64 KiB)")
    target: StrictStr | None = Field(default=None, description="Delivery target name",
                                     json_schema_extra=_NAME)
    max_runtime: WholeNumber | None = Field(
        default=None, description="Seconds it is expected to run: what its tenant's budget "
        "reserves for it (absent: the tenant's default_max_runtime); a time limit only where the "
        "tenant has stop_at_max_runtime", examples=[7200],
        json_schema_extra={"minimum": 1, "maximum": MAX_RUNTIME})


# The most requests one batch submit may carry (docs/decisions/309-batch-submit.md).
MAX_BATCH = 1000


class BatchEntryBody(_Body):
    """One entry of a batch: the shape of a submit, its values judged per entry.

    The value constraints of :class:`SubmitBody` are not stated here: an entry that
    breaks them is not a malformed batch but an entry answered with its error in
    ``results[i]``, as a single submit of it would be answered."""

    id: StrictStr = Field(description="Stable request id: the idempotency key", examples=["job-1"])
    cost: dict[StrictStr, WholeNumber] = Field(description="Amount per resource",
                                               examples=[{"gpu": 1}])
    priority: WholeNumber = 0
    payload: Any = Field(default=None, description="JSON handed to the executor (at most 64 KiB)")
    target: StrictStr | None = Field(default=None, description="Delivery target name")
    max_runtime: WholeNumber | None = Field(
        default=None, description="Seconds it is expected to run: what its tenant's budget "
        "reserves for it (absent: the tenant's default_max_runtime); a time limit only where the "
        "tenant has stop_at_max_runtime")


class BatchSubmitBody(_Body):
    requests: list[BatchEntryBody] = Field(
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
    reason: StrictStr | None = Field(default=None, max_length=1024,
                                     json_schema_extra={"pattern": "^[^\\x00]*$"})
    fencing_token: WholeNumber | None = Field(
        default=None,
        description="Executor callbacks: the fencing token the delivery carried "
                    "(Quotagate-Fencing-Token); required with an executor token",
    )
    force: StrictBool = Field(
        default=False,
        description="An admin's complete or fail for a lost executor: end the request now and "
                    "return its cost now, even while its work may still run (an oversell no "
                    "counter shows; audited as forced, docs/decisions/820). Without it, an "
                    "admin's complete or fail of work an executor may hold is a stop (202)",
    )


class EndEntry(_Body):
    id: StrictStr = Field(description="The request id", examples=["job-1"])
    state: Literal["completed", "failed"] = Field(description="How the work ended")
    reason: StrictStr | None = Field(default=None, max_length=1024)
    fencing_token: WholeNumber | None = Field(
        default=None, description="The fencing token the delivery carried; required with an "
        "executor token")
    force: StrictBool = Field(default=False, description="An admin's end now, as the single "
                              "call's `force`")


class BatchEndBody(_Body):
    ends: list[EndEntry] = Field(
        description=f"Up to {MAX_BATCH} ends, each answered as its single complete/fail would be",
        json_schema_extra={"maxItems": MAX_BATCH},
    )


class EndResult(BaseModel):
    status: int = Field(description="The status its single complete/fail would have answered")
    request: dict[str, Any] | None = Field(default=None, description="The request (200, 202)")
    released: dict[str, int] | None = Field(default=None, description="Cost returned (200; "
                                            "202: nothing yet, the stop was asked)")
    error: dict[str, Any] | None = Field(default=None, description="{code, message} (4xx, 5xx)")


class BatchEndAnswer(BaseModel):
    results: list[EndResult] = Field(description="One entry per end, in order")
