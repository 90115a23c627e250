"""When to try a failed delivery again: exponential backoff with a ceiling."""

from __future__ import annotations

from dataclasses import dataclass

from quotagate.errors import InvalidInput


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidInput("max attempts must be at least 1", code="invalid_max_attempts")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise InvalidInput(
                "retry delays must satisfy 0 <= base <= max", code="invalid_retry_delay"
            )

    def gives_up(self, attempts: int) -> bool:
        """After ``attempts`` failed deliveries, is the request failed for good?"""
        return attempts >= self.max_attempts

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failure (1, 2, 4, … times the base)."""
        if attempts < 1:
            return 0.0
        return float(min(self.max_delay, self.base_delay * 2 ** min(attempts - 1, 32)))
