"""The dry run's verdict, pure: what comes first takes its room first, then the reasons."""

from __future__ import annotations

from quotagate.domain.dry_run import Reason, Verdict, describe_verdict, judge, waiting_reason
from quotagate.domain.explanation import WaitingReason
from quotagate.domain.placement import Candidate
from quotagate.domain.sharing import MemberLimits, Sharing

POOLS = {"pool-1": {"gpu": (0, 4), "cpu": (0, 8)}, "pool-2": {"gpu": (0, 1), "cpu": (0, 1)}}


def test_a_fitting_request_with_nothing_ahead_is_admissible() -> None:
    verdict = judge(Candidate("r", "a", {"gpu": 1}), queue=[Candidate("r", "a", {"gpu": 1})],
                    tenants={"a": {"gpu": (0, 2)}}, pools=POOLS, sharing=Sharing(),
                    tenant_position=1, admission_window=32)
    assert verdict.admissible and verdict.reasons == []
    assert describe_verdict(verdict, 32).startswith("fits now")


def test_what_comes_first_is_placed_first() -> None:
    request = Candidate("r", "b", {"gpu": 1, "cpu": 1})
    queue = [Candidate("x", "a", {"gpu": 2}), Candidate("y", "b", {"gpu": 3}), request]
    tenants = {"a": {"gpu": (0, 2)}, "b": {"gpu": (0, 9), "cpu": (0, 9)}}
    verdict = judge(request, queue=queue, tenants=tenants, pools=POOLS, sharing=Sharing(),
                    tenant_position=2, admission_window=32)
    # x takes 2 of pool-1's 4 gpu; y (3 gpu) then fits no pool and is skipped, as
    # admission skips it; b's request still fits pool-2.
    assert verdict.admissible
    mine = Candidate("s", "a", {"gpu": 1})
    blocked = judge(mine, queue=[queue[0], mine], tenants=tenants, pools=POOLS,
                    sharing=Sharing(), tenant_position=2, admission_window=32)
    assert blocked.reasons == [Reason("tenant_quota", "gpu", 1, 0)]


def test_with_weights_the_lower_share_goes_first_whatever_the_queue_order() -> None:
    # a uses a quarter of its nominal already: b's request, behind a's in queue order,
    # goes first.
    request = Candidate("r", "b", {"gpu": 2})
    queue = [Candidate("x", "a", {"gpu": 3}), request]
    tenants = {"a": {"gpu": (2, 8)}, "b": {"gpu": (0, 4)}}
    pools = {"pool-1": {"gpu": (2, 5)}}
    plain = judge(request, queue=queue, tenants=tenants, pools=pools, sharing=Sharing(),
                  tenant_position=1, admission_window=32)
    assert plain.reasons == [Reason("pool_capacity", "gpu", 2, 0)]
    fair = judge(request, queue=queue, tenants=tenants, pools=pools, sharing=Sharing(),
                 weights={}, tenant_position=1, admission_window=32)
    assert fair.admissible


def test_every_reason_names_what_is_needed_and_available() -> None:
    request = Candidate("r", "a", {"gpu": 5, "cpu": 2})
    verdict = judge(request, queue=[request], tenants={"a": {"gpu": (1, 4), "cpu": (0, 8)}},
                    pools=POOLS, sharing=Sharing(), tenant_position=1, admission_window=32,
                    rate_tokens=0.25, max_priority=(50, 10))
    assert verdict.reasons == [
        Reason("priority_above_max", "priority", 50, 10),
        Reason("rate_limited", "tokens", 1, 0.25),
        Reason("tenant_quota", "gpu", 5, 3),
        Reason("pool_capacity", "gpu", 5, 4),
    ]
    assert describe_verdict(verdict, 32).startswith(
        "priority_above_max: priority needs 50, 10 available; rate_limited: tokens needs 1, "
        "0.25 available; tenant_quota: gpu needs 5, 3 available")


def test_a_members_reasons_come_from_its_cohort() -> None:
    sharing = Sharing(roots={"a": "org", "b": "org"},
                      limits={("a", "gpu"): MemberLimits(2, borrowing_limit=2),
                              ("b", "gpu"): MemberLimits(2)},
                      cohorts={"org": {"gpu": (3, 4)}})
    tenants = {"a": {"gpu": (2, 2)}, "b": {"gpu": (1, 2)}}
    request = Candidate("r", "a", {"gpu": 2})
    verdict = judge(request, queue=[request], tenants=tenants, pools=POOLS, sharing=sharing,
                    tenant_position=1, admission_window=32)
    assert verdict.member and verdict.reasons == [Reason("cohort_capacity", "gpu", 2, 1)]


def test_beyond_the_window_it_waits_for_its_queue() -> None:
    request = Candidate("r", "a", {"gpu": 1})
    verdict = judge(request, queue=[request], tenants={"a": {"gpu": (0, 2)}}, pools=POOLS,
                    sharing=Sharing(), tenant_position=40, admission_window=32)
    assert verdict.reasons == [Reason("queue_window", "queue", 40, 32)]


def test_the_waiting_sentence_is_the_verdicts_when_the_plain_one_cannot_see_the_reason() -> None:
    plain = WaitingReason(fitting_pools=["pool-1"],
                          reason="fits now; it will be admitted by the next admission pass")
    held = Verdict(False, [Reason("held_for_preemptor", "room", 1, 0)])
    assert waiting_reason(held, plain, 32).startswith(
        "held_for_preemptor: fits, but only in room a preemption freed for a waiting preemptor")
    budget = Verdict(False, [Reason("budget_exhausted", "gpu", 6, 4)])
    assert waiting_reason(budget, plain, 32) == "budget_exhausted: gpu needs 6h, 4h available"
    member = Verdict(False, [Reason("borrowing_limit", "gpu", 2, 1)], member=True)
    assert waiting_reason(member, plain, 32) == "borrowing_limit: gpu needs 2, 1 available"
    # A plain tenant's quota and pools: the plain sentence says more (what is used of what).
    quota = Verdict(False, [Reason("tenant_quota", "gpu", 1, 0)])
    today = WaitingReason(tenant_blocked_by=[{"resource": "gpu", "need": 1, "used": 2,
                                              "cap": 2}],
                          fitting_pools=["pool-1"], reason="tenant quota: gpu needs 1, 0 of 2 left")
    assert waiting_reason(quota, today, 32) == "tenant quota: gpu needs 1, 0 of 2 left"


def test_behind_its_own_tenants_earlier_requests_the_sentence_names_them() -> None:
    tenants = {"a": {"gpu": (0, 2)}}
    earlier = [Candidate(f"e-{index}", "a", {"gpu": 1}) for index in range(2)]
    request = Candidate("r", "a", {"gpu": 1})
    verdict = judge(request, queue=[*earlier, request], tenants=tenants, pools=POOLS,
                    sharing=Sharing(), tenant_position=3, admission_window=32)
    assert verdict.ahead == ("e-0", "e-1")
    assert verdict.reasons == [Reason("tenant_quota", "gpu", 1, 0)]
    # Today's usage has room: the plain sentence would say it fits now.
    plain = WaitingReason(fitting_pools=["pool-1"],
                          reason="fits now; it will be admitted by the next admission pass")
    assert waiting_reason(verdict, plain, 32) == (
        "behind 2 earlier requests of its tenant (e-0, e-1), which the next admission pass "
        "admits first; then tenant_quota: gpu needs 1, 0 available")
    many = Verdict(False, [Reason("tenant_quota", "gpu", 1, 0)],
                   ahead=tuple(f"e-{index}" for index in range(5)))
    assert describe_verdict(many, 32).startswith(
        "behind 5 earlier requests of its tenant (e-0, e-1, e-2, +2 more), which")
    # Other tenants' requests placed first are counted as theirs, not named.
    other = Verdict(False, [Reason("pool_capacity", "gpu", 1, 0)])
    assert waiting_reason(other, plain, 32) == (
        "fits today's usage, but the next admission pass places other tenants' requests "
        "first; then pool_capacity: gpu needs 1, 0 available")
