"""The dry run's verdict, pure: what is ahead takes its room first, then the reasons."""

from __future__ import annotations

from quotagate.domain.dry_run import Reason, describe_verdict, judge
from quotagate.domain.placement import Candidate
from quotagate.domain.sharing import MemberLimits, Sharing

POOLS = {"pool-1": {"gpu": (0, 4), "cpu": (0, 8)}, "pool-2": {"gpu": (0, 1), "cpu": (0, 1)}}


def test_a_fitting_request_with_nothing_ahead_is_admissible() -> None:
    verdict = judge("a", {"gpu": 1}, ahead=[], tenants={"a": {"gpu": (0, 2)}}, pools=POOLS,
                    sharing=Sharing(), tenant_position=1, admission_window=32)
    assert verdict.admissible and verdict.reasons == []
    assert describe_verdict(verdict, 32).startswith("fits now")


def test_what_is_ahead_is_placed_first() -> None:
    ahead = [Candidate("x", "a", {"gpu": 2}), Candidate("y", "b", {"gpu": 3})]
    verdict = judge("b", {"gpu": 1, "cpu": 1}, ahead=ahead,
                    tenants={"a": {"gpu": (0, 2)}, "b": {"gpu": (0, 9), "cpu": (0, 9)}},
                    pools=POOLS, sharing=Sharing(), tenant_position=2, admission_window=32)
    # x takes 2 of pool-1's 4 gpu; y (3 gpu) then fits no pool and is skipped, as
    # admission skips it; b's request still fits pool-2.
    assert verdict.admissible
    blocked = judge("a", {"gpu": 1}, ahead=ahead[:1], tenants={"a": {"gpu": (0, 2)}},
                    pools=POOLS, sharing=Sharing(), tenant_position=2, admission_window=32)
    assert blocked.reasons == [Reason("tenant_quota", "gpu", 1, 0)]


def test_every_reason_names_what_is_needed_and_available() -> None:
    verdict = judge("a", {"gpu": 5, "cpu": 2}, ahead=[],
                    tenants={"a": {"gpu": (1, 4), "cpu": (0, 8)}}, pools=POOLS,
                    sharing=Sharing(), tenant_position=1, admission_window=32,
                    rate_tokens=0.25)
    assert verdict.reasons == [
        Reason("rate_limited", "tokens", 1, 0.25),
        Reason("tenant_quota", "gpu", 5, 3),
        Reason("pool_capacity", "gpu", 5, 4),
    ]
    assert describe_verdict(verdict, 32) == (
        "rate_limited: tokens needs 1, 0.25 available; tenant_quota: gpu needs 5, 3 available; "
        "pool_capacity: gpu needs 5, 4 available")


def test_a_members_reasons_come_from_its_cohort() -> None:
    sharing = Sharing(roots={"a": "org", "b": "org"},
                      limits={("a", "gpu"): MemberLimits(2, borrowing_limit=2),
                              ("b", "gpu"): MemberLimits(2)},
                      cohorts={"org": {"gpu": (3, 4)}})
    tenants = {"a": {"gpu": (2, 2)}, "b": {"gpu": (1, 2)}}
    verdict = judge("a", {"gpu": 2}, ahead=[], tenants=tenants, pools=POOLS, sharing=sharing,
                    tenant_position=1, admission_window=32)
    assert verdict.member and verdict.reasons == [Reason("cohort_capacity", "gpu", 2, 1)]


def test_beyond_the_window_it_waits_for_its_queue() -> None:
    verdict = judge("a", {"gpu": 1}, ahead=[], tenants={"a": {"gpu": (0, 2)}}, pools=POOLS,
                    sharing=Sharing(), tenant_position=40, admission_window=32)
    assert verdict.reasons == [Reason("queue_window", "queue", 40, 32)]
