"""How a rate decision that refused a submission reads: reason, retry-after, error.

Pure functions of a :class:`~quotagate.domain.bucket.Decision`, shared by the
ledger (which records the refusal), the rate quotas (which print tokens) and
the stream producer (which answers a refused append).
"""

from __future__ import annotations

import math

from quotagate.domain.bucket import Decision
from quotagate.errors import RateLimited, quoted

__all__ = [
    "NO_REFILL_RETRY_AFTER",
    "format_tokens",
    "rate_limited",
    "rejection_reason",
    "retry_after_seconds",
]

# A bucket without refill gains tokens only by a top-up nobody can predict;
# clients are told to look again after this many seconds.
NO_REFILL_RETRY_AFTER = 60.0


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
        else "the bucket does not refill: it needs a top-up ('quotagate rate add')"
    )
    return RateLimited(
        f"tenant {quoted(tenant)} has no rate quota left for request {quoted(request_id)} "
        f"({rejection_reason(decision)}); it was recorded as rejected; {when}",
        code="rate_quota_exhausted",
        retry_after=round(retry_after, 3),
        tenant=tenant,
        request_id=request_id,
        tokens_left=decision.remaining,
        capacity=decision.capacity,
        refill_per_second=decision.refill_per_second,
    )
