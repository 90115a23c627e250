"""Fair share between tenants, pure: weighted dominant share, and the planner's order."""

from __future__ import annotations

from quotagate.domain.fairness import dominant_share
from quotagate.domain.placement import Candidate, plan_admissions


def test_the_dominant_share_is_the_largest_use_to_nominal_ratio_over_the_weight() -> None:
    assert dominant_share({"gpu": (1, 4), "cpu": (6, 8)}) == 0.75
    assert dominant_share({"gpu": (1, 4), "cpu": (6, 8)}, weight=3) == 0.25
    assert dominant_share({}) == 0.0
    assert dominant_share({"gpu": (2, 0)}) == 2.0  # used without a nominal: as if it were 1


def _queue(tenant: str, count: int) -> list[Candidate]:
    return [Candidate(f"{tenant}-{index}", tenant, {"gpu": 1}) for index in range(count)]


def test_a_high_priority_tenant_does_not_take_everything() -> None:
    # a's requests come first in queue order (say, priority 1000000): plain order gives a
    # all 6 places, fair order shares them.
    candidates = _queue("a", 6) + _queue("b", 6)
    tenants = {"a": {"gpu": (0, 10)}, "b": {"gpu": (0, 10)}}
    pools = {"pool-1": {"gpu": (0, 6)}}
    plain = plan_admissions(candidates, tenants, pools, 6)
    assert {placement.tenant for placement in plain} == {"a"}
    fair = plan_admissions(candidates, tenants, pools, 6, weights={})
    assert [placement.tenant for placement in fair].count("b") == 3


def test_weights_share_in_proportion() -> None:
    candidates = _queue("a", 12) + _queue("b", 12)
    tenants = {"a": {"gpu": (0, 12)}, "b": {"gpu": (0, 12)}}
    fair = plan_admissions(candidates, tenants, {"pool-1": {"gpu": (0, 9)}}, 9,
                           weights={"b": 2})
    tenants_placed = [placement.tenant for placement in fair]
    assert (tenants_placed.count("a"), tenants_placed.count("b")) == (3, 6)


def test_within_a_tenant_queue_order_holds_and_a_misfit_is_skipped() -> None:
    candidates = [Candidate("a-big", "a", {"gpu": 5}), Candidate("a-small", "a", {"gpu": 1}),
                  Candidate("b-0", "b", {"gpu": 1})]
    tenants = {"a": {"gpu": (0, 10)}, "b": {"gpu": (0, 10)}}
    fair = plan_admissions(candidates, tenants, {"pool-1": {"gpu": (0, 2)}}, 5, weights={})
    assert [placement.id for placement in fair] == ["a-small", "b-0"]
