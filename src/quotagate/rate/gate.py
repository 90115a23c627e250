"""What the ledger's submit path needs from rate quotas, and how a refusal reads.

The ledger asks for a token after it has validated a submission and before it
records it as waiting: the quota is decided *before* the request enters the
queue (docs/rate-quotas.md). A refusal is recorded as a ``rejected`` request with the
reason built here, and the caller gets :class:`~quotagate.errors.RateLimited`.
"""

from __future__ import annotations

import math
from typing import Protocol

import sqlalchemy as sa

from quotagate.domain.bucket import Decision
from quotagate.errors import RateLimited

# A bucket without refill gains tokens only by a top-up nobody can predict;
# clients are told to look again after this many seconds.
NO_REFILL_RETRY_AFTER = 60.0


class RateGate(Protocol):
    @property
    def in_transaction(self) -> bool:
        """True when a take rolls back with the submission's transaction."""
        ...

    def take_for_submission(
        self, connection: sa.Connection, tenant: str, amount: int = 1
    ) -> Decision:
        """Take tokens for one submission of ``tenant`` in its transaction (``in_transaction``
        stores only; unlimited if it has no bucket)."""
        ...

    def take_outside(self, tenant: str, amount: int = 1) -> Decision:
        """Take tokens with no ledger transaction open (a store that is not the ledger's)."""
        ...

    def refund(self, tenant: str, amount: int = 1) -> None:
        """Give back tokens taken outside a transaction that then did not commit."""
        ...


def format_tokens(tokens: float) -> str:
    if math.isinf(tokens):
        return "unlimited"
    return str(int(tokens)) if float(tokens).is_integer() else f"{tokens:.2f}"


def rejection_reason(decision: Decision) -> str:
    """The reason kept with a rejected request: ``rate quota exhausted: 0 tokens left``."""
    return f"rate quota exhausted: {format_tokens(decision.remaining)} tokens left"


def retry_after_seconds(decision: Decision) -> float:
    return NO_REFILL_RETRY_AFTER if decision.retry_after is None else decision.retry_after


def rate_limited(decision: Decision, tenant: str, request_id: str) -> RateLimited:
    retry_after = retry_after_seconds(decision)
    when = (
        f"retry after {retry_after:.1f}s"
        if decision.retry_after is not None
        else "the bucket does not refill: it needs a top-up ('quotagate tokens add')"
    )
    return RateLimited(
        f"tenant {tenant!r} has no rate quota left for request {request_id!r} "
        f"({rejection_reason(decision)}); it was recorded as rejected; {when}",
        code="rate_quota_exhausted",
        retry_after=round(retry_after, 3),
        tenant=tenant,
        request_id=request_id,
        tokens_left=decision.remaining,
        capacity=decision.capacity,
        refill_per_second=decision.refill_per_second,
    )
