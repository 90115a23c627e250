"""Budget and half-life rules, pure (quotagate.domain.budget, quotagate.domain.fairness)."""

from __future__ import annotations

import math

import pytest

from quotagate.domain.budget import (
    BudgetLimit,
    Budgets,
    BudgetState,
    buckets,
    format_duration,
    overrun_reason,
    parse_budget,
    parse_duration,
    parse_grace,
    reservation,
    window_start,
)
from quotagate.domain.fairness import FairOrder, decayed, held_decayed, past_share
from quotagate.domain.placement import Candidate, plan_admissions
from quotagate.errors import InvalidInput


def test_budgets_and_durations_parse_and_print() -> None:
    assert parse_budget("100h/30d") == BudgetLimit(100 * 3600, 30 * 86400)
    assert parse_budget("90m/12h") == BudgetLimit(5400, 12 * 3600)
    assert parse_budget("100h/30d").describe() == "100h/30d"
    assert parse_duration("2h", what="max_runtime") == 7200
    assert parse_duration(90, what="max_runtime") == 90
    # Whole seconds as the CLI passes them: what the refusal says is accepted, is.
    assert parse_duration("3600", what="max_runtime") == 3600
    assert format_duration(5400) == "90m" and format_duration(61) == "61s"


@pytest.mark.parametrize("text", ["100h", "100h/30m", "0h/1d", "01h/1d", "1h/417d", "h/1d", 5])
def test_a_malformed_budget_is_refused(text: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_budget(text)
    assert refused.value.code == "invalid_budget"


@pytest.mark.parametrize("value", ["0s", "2 h", "367d", 0, True, 1.5, "soon", "0", "-5",
                                   "31622401", "\uff18", "9" * 5000])
def test_a_malformed_max_runtime_is_refused(value: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_duration(value, what="max_runtime")
    assert refused.value.code == "invalid_max_runtime"


def test_a_grace_is_whole_seconds_or_a_duration_from_none_to_a_week() -> None:
    assert parse_grace(0) == 0 and parse_grace("0") == 0
    assert parse_grace(300) == 300 and parse_grace("300") == 300 and parse_grace("5m") == 300
    assert parse_grace("7d") == parse_grace(604_800) == 604_800
    assert overrun_reason(3600) == "max_runtime 3600s exceeded"
    assert overrun_reason(3600, 300) == "max_runtime 3600s exceeded (grace 300s)"


@pytest.mark.parametrize("value", [-1, "-1", 1.5, "1.5", True, None, "soon", "5 m", "\uff18",
                                   604_801, "8d", 10**12, "9" * 5000])
def test_a_malformed_grace_is_refused(value: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_grace(value)
    assert refused.value.code == "invalid_max_runtime_grace"
    assert str(refused.value).startswith("max_runtime_grace must be")


def test_held_time_is_split_over_the_hours_it_covers() -> None:
    assert list(buckets(3000, 9000)) == [(0, 600), (3600, 3600), (7200, 1800)]
    assert list(buckets(3600, 3600)) == []
    assert window_start(10 * 3600 + 5, 3600) == 9 * 3600


def test_a_reservation_fits_what_is_left_or_the_request_is_blocked() -> None:
    budgets = Budgets({("team-a", "gpu"): BudgetState(amount=36000, window=86400,
                                                      reserved=14400, spent=7200,
                                                      accrued=7200)})
    assert reservation({"gpu": 2, "cpu": 1}, 3600) == {"gpu": 7200, "cpu": 3600}
    assert budgets.fits("team-a", {"gpu": 2}, 7200)  # 14400 of 14400 left
    assert not budgets.fits("team-a", {"gpu": 2}, 7201)
    assert budgets.fits("team-b", {"gpu": 99}, 86400)  # no budget: not limited
    blocked = budgets.blocking("team-a", {"gpu": 3}, 7200)
    assert [(b.resource, b.needed, b.available) for b in blocked] == [("gpu", 21600, 14400.0)]
    # A plan charges its copy: the second request no longer fits.
    plan = plan_admissions(
        [Candidate("one", "team-a", {"gpu": 1}, 14400), Candidate("two", "team-a", {"gpu": 1}, 60)],
        {"team-a": {"gpu": (0, 8)}}, {"pool": {"gpu": (0, 8)}}, 4, budgets=budgets)
    assert [placement.id for placement in plan] == ["one"]
    assert budgets.states["team-a", "gpu"].reserved == 14400  # the caller's is unchanged


def test_without_a_max_runtime_something_must_be_left() -> None:
    full = Budgets({("team-a", "gpu"): BudgetState(3600, 86400, 0, 3600, 3600)})
    assert not full.fits("team-a", {"gpu": 1}, None)
    assert full.blocking("team-a", {"gpu": 1}, None)[0].needed == 0


def test_decayed_use_halves_every_half_life_and_held_time_integrates_exactly() -> None:
    assert decayed(8.0, 0.0, 7200.0, 3600) == pytest.approx(2.0)
    assert decayed(8.0, None, 7200.0, 3600) == 0.0
    # Held for a very long time: the decayed integral tends to amount x mean life.
    assert held_decayed(2, 1e9, 3600) == pytest.approx(2 * 3600 / math.log(2))
    # Split in two, decayed in between, it adds up to the same as held at once.
    first = decayed(held_decayed(1, 1000, 3600), 1000.0, 3000.0, 3600)
    assert first + held_decayed(1, 2000, 3600) == pytest.approx(held_decayed(1, 3000, 3600))
    # A nominal held all along is a past share of 1.
    mean_life = 3600 / math.log(2)
    assert past_share({"gpu": (4 * mean_life, 0.0)}, {"gpu": (0, 4)}, 3600, 0.0) == 1.0


def test_past_shares_reorder_tenants_of_equal_current_share() -> None:
    candidates = [Candidate("a-1", "team-a", {"gpu": 1}), Candidate("b-1", "team-b", {"gpu": 1})]
    usage = {"team-a": {"gpu": (0, 2)}, "team-b": {"gpu": (0, 2)}}
    assert [c.id for c in FairOrder(candidates, usage, {})] == ["a-1", "b-1"]
    assert [c.id for c in FairOrder(candidates, usage, {}, {"team-a": 0.5})] == ["b-1", "a-1"]
