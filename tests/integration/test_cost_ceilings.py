"""A cost no admission could ever grant is refused at submit (docs/decisions/809).

More than the tenant could ever hold, or more than any one pool holds: refused with the
resource, the cost and the limit, writing nothing; the dry run and a batch judge it the
same. A request accepted before its quota was lowered under its cost waits, and explain
and diagnose say why. On every backend.
"""

from __future__ import annotations

import pytest

from quotagate import InvalidInput, Quotagate
from quotagate.streaming.diagnose import diagnose
from support.ledger_state import snapshot


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_pool("pool-1", {"gpu": 8, "cpu": 16})
    gate.set_pool("pool-2", {"gpu": 2, "cpu": 64}, slices=2)
    gate.set_tenant("team-a", {"gpu": 4, "cpu": 64})
    return gate


def _refusal(gate: Quotagate, cost: dict[str, object], tenant: str = "team-a") -> InvalidInput:
    before = snapshot(gate)
    with pytest.raises(InvalidInput) as refused:
        gate.submit("job-x", tenant, cost)
    assert snapshot(gate) == before  # nothing written, not even an audit row
    with pytest.raises(InvalidInput) as simulated:
        gate.simulate(tenant, cost)
    assert (simulated.value.code, simulated.value.message) == (refused.value.code,
                                                               refused.value.message)
    return refused.value


def test_a_cost_above_the_tenants_quota_is_refused_naming_resource_cost_and_limit(
    ledger: Quotagate,
) -> None:
    refused = _refusal(ledger, {"gpu": 5})
    assert refused.code == "cost_above_quota"
    assert refused.fields == {"resource": "gpu", "needed": 5, "limit": 4}
    assert refused.message == ("cost gpu=5 is more than tenant 'team-a' can ever hold: its "
                               "quota allows gpu=4; nothing was submitted")
    # A resource the tenant has no quota for at all: a cap of zero.
    ledger.set_pool("pool-1", {"gpu": 8, "cpu": 16, "memory_gib": 64})
    assert _refusal(ledger, {"memory_gib": 1}).fields == {
        "resource": "memory_gib", "needed": 1, "limit": 0}
    assert ledger.submit("job-1", "team-a", {"gpu": 4}).created  # at the limit: accepted


def test_a_cost_more_than_any_pool_holds_is_refused(ledger: Quotagate) -> None:
    ledger.set_tenant("team-a", {"gpu": 100, "cpu": 100})
    refused = _refusal(ledger, {"gpu": 9})
    assert refused.code == "cost_above_capacity"
    assert refused.fields == {"resource": "gpu", "needed": 9, "limit": 8}
    # Each resource fits some pool, no pool holds both: pool-1 lacks cpu, pool-2 gpu.
    both = _refusal(ledger, {"gpu": 4, "cpu": 32})
    assert both.code == "cost_above_capacity"
    assert both.message == ("no pool holds cpu=32, gpu=4 at once: each lacks one of them; "
                            "nothing was submitted")
    # A sliced pool holds the sum of its slices (admission rebalances into one).
    assert ledger.submit("job-1", "team-a", {"gpu": 1, "cpu": 64}).created


def test_a_cohort_member_is_bounded_by_nominal_plus_borrowing_limit(ledger: Quotagate) -> None:
    ledger.set_cohort("org")
    ledger.set_tenant("lender", {"gpu": 6}, cohort="org")
    ledger.set_tenant("bounded", {"gpu": 1}, cohort="org", borrowing_limit={"gpu": 2})
    ledger.set_tenant("free", {"gpu": 1}, cohort="org")
    assert _refusal(ledger, {"gpu": 4}, tenant="bounded").fields == {
        "resource": "gpu", "needed": 4, "limit": 3}
    assert ledger.submit("job-1", "bounded", {"gpu": 3}).created
    # No borrowing limit: it may borrow as far as the cohort's room goes (6 + 1 + 1).
    assert ledger.submit("job-2", "free", {"gpu": 7}).created


def test_a_cohort_member_is_bounded_by_its_cohorts_room(ledger: Quotagate) -> None:
    """Nominal 4 + borrowing limit 2 = 6, but the shared room holds 5: a cost of 6 could
    never be granted and is refused, naming the cohort and its room's cap
    (docs/decisions/824). Before, it was accepted and waited until it expired."""
    ledger.set_cohort("org")
    ledger.set_tenant("bounded", {"gpu": 4}, cohort="org", borrowing_limit={"gpu": 2})
    ledger.set_tenant("other", {"gpu": 1}, cohort="org", lending_limit={"gpu": 1})
    refused = _refusal(ledger, {"gpu": 6}, tenant="bounded")
    assert refused.code == "cost_above_cohort_room"
    assert refused.fields == {"resource": "gpu", "needed": 6, "limit": 5, "cohort": "org"}
    assert refused.message == (
        "cost gpu=6 is more than tenant 'bounded' can ever hold: its guaranteed gpu=0 plus "
        "the shared room of cohort 'org' (cap gpu=5) allow gpu=5; nothing was submitted")
    # Without a borrowing limit the room alone bounds it; a guaranteed part (nominal less
    # its lending limit) is its own, outside the room (room: 4 lent + 1 lent = 5).
    ledger.set_tenant("bounded", {"gpu": 4}, cohort="org", borrowing_limit={"gpu": None},
                      lending_limit={"gpu": 2})
    ledger.set_tenant("other", {"gpu": 3}, cohort="org", lending_limit={"gpu": 3})
    refused = _refusal(ledger, {"gpu": 8}, tenant="bounded")
    assert (refused.code, refused.fields["limit"]) == ("cost_above_cohort_room", 7)
    assert "its guaranteed gpu=2 plus the shared room of cohort 'org' (cap gpu=5)" in (
        refused.message)
    # A borrowing limit tighter than the room is named as before.
    ledger.set_tenant("bounded", {"gpu": 4}, cohort="org", borrowing_limit={"gpu": 1})
    assert _refusal(ledger, {"gpu": 6}, tenant="bounded").code == "cost_above_quota"
    # At the limit: accepted. The room shrunk under it (the other member lends less), it
    # waits and explain says it cannot be admitted until the room grows; then it is.
    ledger.set_tenant("bounded", {"gpu": 4}, cohort="org", borrowing_limit={"gpu": None})
    assert ledger.submit("job-1", "bounded", {"gpu": 7}).created
    ledger.set_tenant("other", {"gpu": 3}, cohort="org", lending_limit={"gpu": 1})
    assert ledger.admit() == []
    assert ledger.explain("job-1")["reason"].endswith(
        "; its limits and its cohort's shared room allow at most gpu=5: it cannot be admitted "
        "until they are raised")
    ledger.set_tenant("other", {"gpu": 3}, cohort="org", lending_limit={"gpu": 3})
    assert not ledger.explain("job-1")["reason"].endswith("until they are raised")
    assert [placement.id for placement in ledger.admit()] == ["job-1"]


def test_a_batch_refuses_the_entry_and_takes_the_others(ledger: Quotagate) -> None:
    results = ledger.submit_many("team-a", [{"id": "job-1", "cost": {"gpu": 1}},
                                            {"id": "job-2", "cost": {"gpu": 5}},
                                            {"id": "job-3", "cost": {"gpu": 9}}])
    assert not isinstance(results[0], Exception) and results[0].created
    assert isinstance(results[1], InvalidInput) and results[1].code == "cost_above_quota"
    assert isinstance(results[2], InvalidInput) and results[2].code == "cost_above_quota"
    assert [request.id for request in ledger.list_requests("team-a").items] == ["job-1"]


def test_a_quota_lowered_under_a_waiting_cost_keeps_it_waiting_and_says_why(
    ledger: Quotagate,
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 4})
    ledger.set_tenant("team-a", {"gpu": 2, "cpu": 64})
    assert ledger.admit() == []
    # Its replay is still the original request, not a refusal.
    assert not ledger.submit("job-1", "team-a", {"gpu": 4}).created
    why = ledger.explain("job-1")["reason"]
    assert why == ("tenant quota: gpu needs 4, more than its whole quota of 2; it cannot be "
                   "admitted until the quota is raised")
    assert diagnose(ledger, "job-1")[0].verdict == f"accepted, still waiting: {why}"
    ledger.set_tenant("team-a", {"gpu": 4, "cpu": 64})
    assert [placement.id for placement in ledger.admit()] == ["job-1"]


def test_a_pool_shrunk_under_a_waiting_cost_says_no_pool_could_ever_hold_it(
    ledger: Quotagate,
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 4})
    ledger.set_pool("pool-1", {"gpu": 2, "cpu": 16})
    assert ledger.explain("job-1")["reason"].endswith(
        "no pool could hold it even empty: it cannot be admitted until a pool is given more "
        "capacity")
