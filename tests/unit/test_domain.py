from __future__ import annotations

import pytest

from quotagate.domain.model import build_submission, canonical_payload, validate_amounts
from quotagate.domain.ordering import effective_priority, queue_key
from quotagate.domain.placement import Candidate, best_fit_pool, plan_admissions
from quotagate.errors import InvalidInput, quoted


def test_queue_key_orders_like_aged_priority_at_any_time() -> None:
    interval = 30.0
    old_low = (0, 1000.0)   # priority 0, submitted at t=1000
    new_high = (2, 1075.0)  # priority 2, submitted 75 s later
    for now in (1075.0, 1100.0, 5000.0):
        by_key = queue_key(*old_low, interval) < queue_key(*new_high, interval)
        by_priority = effective_priority(*old_low, now, interval) > effective_priority(
            *new_high, now, interval
        )
        assert by_key == by_priority
    # 75 s of waiting is 2.5 points: the old request is ahead.
    assert queue_key(*old_low, interval) < queue_key(*new_high, interval)


def test_best_fit_picks_the_pool_with_least_room_left() -> None:
    pools = {"big": {"gpu": (0, 8)}, "snug": {"gpu": (1, 3)}, "full": {"gpu": (4, 4)}}
    assert best_fit_pool({"gpu": 2}, pools) == "snug"
    assert best_fit_pool({"gpu": 3}, pools) == "big"
    assert best_fit_pool({"gpu": 9}, pools) is None


def test_best_fit_needs_every_resource_in_one_pool() -> None:
    pools = {"a": {"gpu": (0, 2), "cpu": (0, 1)}, "b": {"gpu": (0, 1), "cpu": (0, 8)}}
    assert best_fit_pool({"gpu": 2, "cpu": 2}, pools) is None


def test_plan_skips_what_does_not_fit_and_charges_as_it_goes() -> None:
    candidates = [
        Candidate("big", "t", {"gpu": 5}),
        Candidate("small-1", "t", {"gpu": 1}),
        Candidate("small-2", "t", {"gpu": 1}),
        Candidate("small-3", "t", {"gpu": 1}),
    ]
    plan = plan_admissions(candidates, {"t": {"gpu": (0, 2)}}, {"p": {"gpu": (0, 10)}}, limit=10)
    assert [placement.id for placement in plan] == ["small-1", "small-2"]


@pytest.mark.parametrize(
    "cost",
    [{}, {"gpu": 0}, {"gpu": -1}, {"gpu": 1.5}, {"gpu": "1"}, {"gpu": True}, {"GPU!": 1}],
)
def test_bad_costs_are_refused(cost: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        validate_amounts(cost, what="cost", allow_zero=False)


@pytest.mark.parametrize(("cost", "says"), [
    ("x", "cost must map resources to amounts, got 'x'"),  # said "must name at least one resource"
    (["gpu"], "cost must map resources to amounts, got ['gpu']"),
    ({}, "cost must name at least one resource"),
])
def test_a_cost_that_is_no_mapping_is_told_so(cost: object, says: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        validate_amounts(cost, what="cost", allow_zero=False)  # type: ignore[arg-type]
    assert (refused.value.code, refused.value.message) == ("invalid_cost", says)


def test_payloads_are_canonical_and_bounded() -> None:
    assert canonical_payload({"b": 1, "a": [1, 2]}) == canonical_payload({"a": [1, 2], "b": 1})
    with pytest.raises(InvalidInput) as error:
        canonical_payload({"blob": "x" * 70_000})
    assert error.value.code == "payload_too_large"
    with pytest.raises(InvalidInput):
        canonical_payload({"nan": float("nan")})


@pytest.mark.parametrize("request_id", ["", "-starts-with-dash", "has space", "x" * 129, 7])
def test_bad_request_ids_are_refused(request_id: object) -> None:
    with pytest.raises(InvalidInput) as error:
        build_submission(request_id=request_id, tenant="team-a", cost={"gpu": 1})
    assert error.value.code == "invalid_request_id"


@pytest.mark.parametrize("tenant", ["Team-A", "team_a", "-a", "a" * 64])
def test_bad_tenant_names_are_refused(tenant: str) -> None:
    with pytest.raises(InvalidInput):
        build_submission(request_id="job-1", tenant=tenant, cost={"gpu": 1})


def test_reasons_from_outside_are_bounded_before_they_reach_the_ledger() -> None:
    from quotagate.domain.model import MAX_REASON_LENGTH, bounded_reason, validate_reason

    for text in ("a\x00b", "bad \ud800 text", "x" * 5000):
        bounded = bounded_reason(text)
        assert bounded is not None and validate_reason(bounded) == bounded
    assert bounded_reason("a\x00b") == "ab"
    assert len(bounded_reason("x" * 5000) or "") == MAX_REASON_LENGTH
    assert bounded_reason(None) is None


def test_an_error_quotes_a_long_value_cut_with_its_length() -> None:
    assert quoted("job-1") == "'job-1'"
    assert quoted("x" * 78) == repr("x" * 78)  # 80 characters with its quotes: whole
    cut = quoted("x" * 100_000)
    assert cut == "'" + "x" * 79 + "… (100000 characters)"


def test_a_payload_nests_at_most_64_levels() -> None:
    assert canonical_payload({"a": [[{"b": 1}]]}) == '{"a":[[{"b":1}]]}'
    nested: object = 1
    for _ in range(64):
        nested = [nested]
    canonical_payload(nested)
    with pytest.raises(InvalidInput, match="deeper than 64 levels") as refused:
        canonical_payload([nested])
    assert refused.value.code == "invalid_payload"
