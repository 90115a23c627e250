"""Token-bucket arithmetic on an injectable clock: no store, no sleeping."""

from __future__ import annotations

import math

import pytest

from quotagate import InvalidInput, ManualClock
from quotagate.domain.bucket import (
    BucketConfig,
    BucketState,
    TokenBucket,
    add_tokens,
    config_from_mapping,
    parse_rate,
    refill,
    retry_after,
    take,
    validate_amount,
)


def test_counting_tokens_without_refill_only_come_back_by_top_up() -> None:
    clock = ManualClock()
    bucket = TokenBucket(BucketConfig(5, 0), clock)
    granted = [bucket.take().granted for _ in range(7)]
    assert granted == [True] * 5 + [False] * 2
    clock.advance(3600)
    refused = bucket.take()
    assert not refused.granted
    assert refused.remaining == 0
    assert refused.retry_after is None  # waiting never helps: it needs a top-up
    assert bucket.add(3) == 3
    assert bucket.take().granted
    assert bucket.tokens == 2


def test_refill_is_proportional_to_elapsed_time_and_capped_at_capacity() -> None:
    clock = ManualClock()
    bucket = TokenBucket(BucketConfig(10, 2), clock)
    assert bucket.take(10).granted
    assert bucket.tokens == 0
    clock.advance(1.5)
    assert bucket.tokens == pytest.approx(3)
    clock.advance(100)
    assert bucket.tokens == 10


def test_take_is_all_or_nothing() -> None:
    clock = ManualClock()
    bucket = TokenBucket(BucketConfig(5, 1), clock, tokens=3)
    refused = bucket.take(4)
    assert not refused.granted
    assert bucket.tokens == 3  # nothing was taken
    assert refused.retry_after == pytest.approx(1.0)
    clock.advance(1.0)
    assert bucket.take(4).granted
    assert bucket.tokens == pytest.approx(0)


def test_retry_after_is_exactly_when_the_take_would_succeed() -> None:
    config = BucketConfig(10, 4)
    clock = ManualClock()
    bucket = TokenBucket(config, clock, tokens=0.5)
    refused = bucket.take(3)
    assert refused.retry_after == pytest.approx(2.5 / 4)
    clock.advance(refused.retry_after * 0.99)
    assert not bucket.take(3).granted
    clock.advance(refused.retry_after * 0.02)
    assert bucket.take(3).granted


def test_retry_after_is_none_when_the_take_exceeds_capacity() -> None:
    assert retry_after(BucketConfig(5, 100), 5, 6) is None
    assert retry_after(BucketConfig(5, 100), 5, 5) == 0


def test_a_clock_that_steps_back_adds_and_loses_nothing() -> None:
    config = BucketConfig(10, 1)
    state = BucketState(tokens=4, updated=1000.0)
    earlier = refill(config, state, 990.0)
    assert earlier.tokens == 4
    assert earlier.updated == 1000.0  # updated never moves backwards
    assert refill(config, earlier, 1002.0).tokens == 6


def test_grants_never_exceed_capacity_plus_refill_times_elapsed() -> None:
    config = BucketConfig(7, 3)
    clock = ManualClock()
    bucket = TokenBucket(config, clock)
    start = clock.now()
    grants = 0
    for step in range(1, 2001):
        clock.advance(0.013 * (step % 7))
        grants += bucket.take(1 + step % 3).granted * (1 + step % 3)
        bound = config.capacity + config.refill_per_second * (clock.now() - start)
        assert grants <= bound + 1e-9


def test_top_up_is_capped_at_capacity() -> None:
    config = BucketConfig(5, 0)
    assert add_tokens(config, BucketState(4, 0.0), 0.0, 3).tokens == 5


def test_pure_take_returns_the_new_state_and_leaves_the_old_one() -> None:
    config = BucketConfig(5, 0)
    state = BucketState(1, 0.0)
    decision, after = take(config, state, 0.0, 1)
    assert decision.granted and decision.remaining == 0
    assert after.tokens == 0 and state.tokens == 1


@pytest.mark.parametrize(
    ("capacity", "refill_rate"),
    [(-1, 0), (5, -2), (0, 1), (2.5, 0), (math.inf, 0), (5, math.nan), (True, 0), ("5", 0),
     (1e13, 0), (5, 1e10)],
)
def test_bad_configurations_are_refused(capacity: object, refill_rate: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        BucketConfig(capacity, refill_rate)  # type: ignore[arg-type]
    assert caught.value.code == "invalid_rate"


@pytest.mark.parametrize("capacity", [-1, 0, 0.5, 1e13])
def test_an_out_of_range_capacity_is_told_the_range_it_must_be_in(capacity: float) -> None:
    # It said "zero or more" for -1, and a 0 was then refused as well.
    with pytest.raises(InvalidInput) as caught:
        BucketConfig(capacity, 0)
    assert str(caught.value).startswith("rate capacity must be at least 1 and at most 1e+12")


@pytest.mark.parametrize(
    "text",
    ["junk", "capacity=", "capacity=five", "refill=1", "capacity=5,burst=2", "capacity=-1",
     "capacity=5,refill=-1", ""],
)
def test_bad_rate_texts_are_refused(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_rate(text)


def test_rate_texts_and_mappings() -> None:
    assert parse_rate("capacity=5,refill=0") == BucketConfig(5, 0)
    assert parse_rate(" capacity = 5 , refill_per_second = 0.5 ") == BucketConfig(5, 0.5)
    assert parse_rate("capacity=3") == BucketConfig(3, 0)
    assert parse_rate("none") is None
    assert config_from_mapping({"capacity": 5, "refill_per_second": 1}) == BucketConfig(5, 1)
    with pytest.raises(InvalidInput):
        config_from_mapping({"capacity": 5, "refill": 1})
    with pytest.raises(InvalidInput):
        config_from_mapping({"refill_per_second": 1})


@pytest.mark.parametrize("amount", [0, -1, 1.5, True, "3"])
def test_amounts_are_whole_positive_numbers(amount: object) -> None:
    with pytest.raises(InvalidInput):
        validate_amount(amount)
