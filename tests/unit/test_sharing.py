"""The pure cohort rules: limits, the shared room, lending attribution, placement."""

from __future__ import annotations

import random

import pytest

from quotagate.domain.placement import Candidate, plan_admissions
from quotagate.domain.sharing import (
    UNBOUNDED,
    Member,
    MemberLimits,
    Sharing,
    attribute_lending,
    cohort_totals,
    root_of,
    shared_delta,
    would_cycle,
)


def test_a_lending_limit_splits_the_nominal_into_guaranteed_and_lendable() -> None:
    limits = MemberLimits(nominal=4, lending_limit=1)
    assert (limits.guaranteed, limits.lendable) == (3, 1)
    assert MemberLimits(nominal=4).guaranteed == 0  # without one, it lends all
    assert MemberLimits(nominal=2, lending_limit=5).lendable == 2  # never more than it has


def test_the_ceiling_is_nominal_plus_borrowing_limit() -> None:
    assert MemberLimits(nominal=4, borrowing_limit=2).ceiling == 6
    assert MemberLimits(nominal=4).ceiling == UNBOUNDED


def test_only_use_above_the_guaranteed_part_occupies_the_shared_room() -> None:
    limits = MemberLimits(nominal=4, lending_limit=1)
    assert [shared_delta(limits, used, 1) for used in range(5)] == [0, 0, 0, 1, 1]
    assert shared_delta(limits, 4, -2) == -1


def test_the_tree_root_and_cycles() -> None:
    parents: dict[str, str | None] = {"org": None, "vision": "org", "faces": "vision"}
    assert root_of("faces", parents) == "org"
    assert would_cycle("org", "faces", parents)
    assert not would_cycle("faces", "org", parents)


def test_lending_is_attributed_within_each_lenders_unused_lendable_room() -> None:
    members = [
        Member("a", 6, MemberLimits(4)),                    # borrows 2
        Member("b", 1, MemberLimits(4, lending_limit=1)),   # can lend 1
        Member("c", 0, MemberLimits(4)),                    # can lend 4
    ]
    lent = attribute_lending(members)
    assert sum(lent.values()) == 2 and lent["a"] == 0
    assert lent["b"] <= 1 and lent["c"] <= 4
    assert cohort_totals(members) == (6 + 0 + 0, 4 + 1 + 4)


def _sharing(limits: dict[str, MemberLimits]) -> tuple[Sharing, dict[str, dict[str, tuple[int, int]]]]:
    tenants = {name: {"gpu": (0, member.nominal)} for name, member in limits.items()}
    members = [Member(name, 0, member) for name, member in limits.items()]
    used, cap = cohort_totals(members)
    sharing = Sharing(roots=dict.fromkeys(limits, "org"),
                      limits={(name, "gpu"): member for name, member in limits.items()},
                      cohorts={"org": {"gpu": (used, cap)}})
    return sharing, tenants


@pytest.mark.parametrize("seed", range(20))
def test_any_sequence_of_placements_keeps_the_cohort_invariants(seed: int) -> None:
    generator = random.Random(seed)
    limits = {
        name: MemberLimits(
            generator.randint(0, 6),
            generator.choice([None, 0, 1, 3]),
            generator.choice([None, 0, 1, 2]),
        )
        for name in ("a", "b", "c")
    }
    sharing, tenants = _sharing(limits)
    pools = {"pool-1": {"gpu": (0, 100)}}
    for step in range(40):
        candidates = [Candidate(f"{step}-{index}", generator.choice("abc"),
                                {"gpu": generator.randint(1, 3)}) for index in range(4)]
        for placement in plan_admissions(candidates, tenants, pools, 4, sharing):
            sharing.charge(placement.tenant, placement.cost, tenants[placement.tenant])
            used, cap = tenants[placement.tenant]["gpu"]
            tenants[placement.tenant]["gpu"] = (used + placement.cost["gpu"], cap)
        members = [Member(name, tenants[name]["gpu"][0], limits[name]) for name in limits]
        assert cohort_totals(members) == sharing.cohorts["org"]["gpu"]
        shared_used, shared_cap = sharing.cohorts["org"]["gpu"]
        assert shared_used <= shared_cap
        assert all(member.used <= member.limits.ceiling for member in members)
        assert sum(m.used for m in members) <= sum(m.limits.nominal for m in members)
        lent = attribute_lending(members)
        assert sum(lent.values()) == sum(member.borrowed for member in members)
        assert all(lent[m.tenant] <= m.limits.lendable for m in members)


def test_the_plan_does_not_change_the_sharing_it_is_given() -> None:
    sharing, tenants = _sharing({"a": MemberLimits(2), "b": MemberLimits(2)})
    plan = plan_admissions([Candidate("x", "a", {"gpu": 3})], tenants,
                           {"p": {"gpu": (0, 9)}}, 1, sharing)
    assert [placement.id for placement in plan] == ["x"]
    assert sharing.cohorts["org"]["gpu"] == (0, 4)


def test_blocking_names_the_limit_that_binds() -> None:
    sharing, tenants = _sharing({"a": MemberLimits(2, borrowing_limit=1), "b": MemberLimits(2)})
    assert [block.code for block in sharing.blocking("a", {"gpu": 4}, tenants["a"])] == [
        "borrowing_limit"]
    sharing.cohorts["org"]["gpu"] = (3, 4)  # b has lent most of its room away
    [block] = sharing.blocking("a", {"gpu": 2}, tenants["a"])
    assert (block.code, block.needed, block.available) == ("cohort_capacity", 2, 1)
    assert sharing.blocking("a", {"cpu": 1}, tenants["a"])[0].code == "tenant_quota"
