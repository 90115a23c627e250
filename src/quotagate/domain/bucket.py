"""Token-bucket arithmetic: pure, so every store decides the same way.

A bucket holds up to ``capacity`` tokens and gains ``refill_per_second``
tokens per second of elapsed time. ``take(n)`` grants all ``n`` tokens or
none. With ``refill_per_second == 0`` a bucket is a plain counter of tokens
that only an explicit top-up replenishes (a "tokens > 0" quota, docs/rate-quotas.md).

The SQL statement and the Redis script in :mod:`quotagate.rate` compute the
same formulas inside the store, where the decision is atomic; this module is
what they are checked against, and what turns a stored state into the numbers
a caller sees (tokens left, seconds until a refused take would succeed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from quotagate.domain.clock import Clock
from quotagate.errors import InvalidInput, quoted

__all__ = [
    "MAX_CAPACITY",
    "MAX_REFILL_PER_SECOND",
    "BucketConfig",
    "BucketState",
    "Decision",
    "TokenBucket",
    "add_tokens",
    "config_from_mapping",
    "decide",
    "parse_rate",
    "refill",
    "retry_after",
    "take",
    "validate_amount",
]

MAX_CAPACITY = 1e12
MAX_REFILL_PER_SECOND = 1e9


def _number(value: object, what: str, *, minimum: float, maximum: float) -> float:
    # bool is an int subclass; "capacity=true" is a mistake, not a 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number, got {quoted(value)}", code="invalid_rate")
    number = float(value)
    if not math.isfinite(number) or number < minimum or number > maximum:
        raise InvalidInput(
            f"{what} must be at least {minimum:g} and at most {maximum:g}, got {quoted(value)}",
            code="invalid_rate",
        )
    return number


@dataclass(frozen=True)
class BucketConfig:
    """The shape of a bucket; construct it to validate what a caller sent."""

    capacity: float
    refill_per_second: float

    def __post_init__(self) -> None:
        # The range is said with the least capacity, 1: "zero or more" invited a 0
        # that the whole-number check then refused.
        capacity = _number(self.capacity, "rate capacity", minimum=1, maximum=MAX_CAPACITY)
        refill_rate = _number(
            self.refill_per_second, "rate refill per second", minimum=0,
            maximum=MAX_REFILL_PER_SECOND,
        )
        if not capacity.is_integer():
            raise InvalidInput(
                "rate capacity must be a whole number of tokens, at least 1, "
                f"got {quoted(self.capacity)}",
                code="invalid_rate",
            )
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "refill_per_second", refill_rate)

    def to_dict(self) -> dict[str, float]:
        return {"capacity": self.capacity, "refill_per_second": self.refill_per_second}


@dataclass(frozen=True)
class BucketState:
    """Tokens in the bucket as of ``updated`` (epoch seconds of the store's clock)."""

    tokens: float
    updated: float


@dataclass(frozen=True)
class Decision:
    """The answer to one take: granted or not, what is left, when to come back."""

    granted: bool
    remaining: float
    capacity: float
    refill_per_second: float
    # Seconds until the same take could succeed; 0 when granted. ``None`` when
    # no amount of waiting helps: a bucket without refill needs a top-up.
    retry_after: float | None

    @classmethod
    def unlimited(cls) -> Decision:
        """The tenant has no bucket: nothing is counted, everything is granted."""
        return cls(True, math.inf, math.inf, 0.0, 0.0)


def validate_amount(value: object, what: str = "amount") -> int:
    """A whole number of tokens, at least 1 (a take or a top-up)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > MAX_CAPACITY:
        raise InvalidInput(
            f"{what} must be a whole number of tokens, at least 1, got {quoted(value)}",
            code="invalid_amount",
        )
    return value


def refill(config: BucketConfig, state: BucketState, now: float) -> BucketState:
    """The state at ``now``. A clock that went backwards adds nothing (and loses nothing)."""
    elapsed = max(0.0, now - state.updated)
    tokens = min(config.capacity, state.tokens + elapsed * config.refill_per_second)
    return BucketState(tokens, max(now, state.updated))


def retry_after(config: BucketConfig, tokens: float, amount: int) -> float | None:
    """Seconds until ``tokens`` grows to ``amount``; None if it never will by refill."""
    missing = amount - tokens
    if missing <= 0:
        return 0.0
    if config.refill_per_second <= 0 or amount > config.capacity:
        return None
    return missing / config.refill_per_second


def decide(config: BucketConfig, tokens: float, amount: int, granted: bool) -> Decision:
    """The caller's view of a decision made (possibly elsewhere) on ``tokens`` left."""
    return Decision(
        granted=granted,
        remaining=tokens,
        capacity=config.capacity,
        refill_per_second=config.refill_per_second,
        retry_after=0.0 if granted else retry_after(config, tokens, amount),
    )


def take(
    config: BucketConfig, state: BucketState, now: float, amount: int = 1
) -> tuple[Decision, BucketState]:
    """Take ``amount`` tokens if all of them are there; return the decision and new state."""
    current = refill(config, state, now)
    if current.tokens >= amount:
        after = BucketState(current.tokens - amount, current.updated)
        return decide(config, after.tokens, amount, True), after
    return decide(config, current.tokens, amount, False), current


def add_tokens(config: BucketConfig, state: BucketState, now: float, amount: float) -> BucketState:
    """A top-up: the bucket never holds more than its capacity."""
    current = refill(config, state, now)
    return BucketState(min(config.capacity, current.tokens + amount), current.updated)


def parse_rate(text: str) -> BucketConfig | None:
    """``"capacity=5,refill=0.5"`` → a config; ``"none"`` → None (remove the bucket).

    ``refill`` may also be spelled ``refill_per_second``; it defaults to 0.
    """
    if text.strip().lower() in ("none", "off"):
        return None
    fields: dict[str, float] = {}
    aliases = {"capacity": "capacity", "refill": "refill_per_second",
               "refill_per_second": "refill_per_second"}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        field = aliases.get(name.strip().lower())
        if not sep or field is None:
            raise InvalidInput(
                f"rate must look like capacity=N,refill=R (or 'none'), got {quoted(text)}",
                code="invalid_rate",
            )
        try:
            fields[field] = float(value)
        except ValueError:
            raise InvalidInput(
                f"rate {name.strip()} must be a number, got {quoted(value.strip())}", code="invalid_rate"
            ) from None
    if "capacity" not in fields:
        raise InvalidInput("rate must name a capacity: capacity=N", code="invalid_rate")
    return config_from_mapping(fields)


def config_from_mapping(fields: Mapping[str, object]) -> BucketConfig:
    """A config from ``{"capacity": …, "refill_per_second": …}`` (JSON bodies, API calls)."""
    unknown = sorted(set(fields) - {"capacity", "refill_per_second"})
    if unknown:
        raise InvalidInput(
            f"unknown rate field {', '.join(map(repr, unknown))}; "
            "expected capacity and refill_per_second",
            code="invalid_rate",
        )
    if "capacity" not in fields:
        raise InvalidInput("rate must name a capacity", code="invalid_rate")
    return BucketConfig(fields["capacity"], fields.get("refill_per_second", 0))  # type: ignore[arg-type]


class TokenBucket:
    """One bucket in memory, on an injectable clock: the reference the stores are tested against."""

    def __init__(self, config: BucketConfig, clock: Clock, *, tokens: float | None = None) -> None:
        self.config = config
        self.clock = clock
        start = config.capacity if tokens is None else tokens
        self.state = BucketState(start, clock.now())

    def take(self, amount: int = 1) -> Decision:
        decision, self.state = take(self.config, self.state, self.clock.now(), amount)
        return decision

    def add(self, amount: float) -> float:
        self.state = add_tokens(self.config, self.state, self.clock.now(), amount)
        return self.state.tokens

    @property
    def tokens(self) -> float:
        return refill(self.config, self.state, self.clock.now()).tokens
