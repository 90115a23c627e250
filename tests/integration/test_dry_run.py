"""The dry run (simulate, ?dry_run=true) and explain's reasons, on every backend."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.errors import Conflict, InvalidInput, NotFound
from quotagate.store import schema


def _everything(gate: Quotagate) -> dict[str, Any]:
    """Every row of every table: a dry run must leave all of it as it was."""
    with gate.engine.connect() as connection:
        return {table.name: sorted(map(tuple, connection.execute(sa.select(table))), key=repr)
                for table in schema.metadata.sorted_tables}


def _codes(answer: dict[str, Any]) -> list[tuple[str, str, float, float]]:
    return [(reason["code"], reason["resource"], reason["needed"], reason["available"])
            for reason in answer["reasons"]]


@pytest.fixture
def plain(gate: Quotagate) -> Quotagate:
    gate.set_pool("pool-1", {"gpu": 4, "cpu": 8})
    gate.set_tenant("team-a", {"gpu": 2, "cpu": 8})
    return gate


def test_a_request_that_fits_is_admissible_and_nothing_is_written(plain: Quotagate) -> None:
    gate = plain
    before = _everything(gate)
    answer = gate.simulate("team-a", {"gpu": 1}, request_id="job-0")
    assert answer == {"admissible": True, "position": 1, "tenant_position": 1, "reasons": [],
                      "would_preempt": []}
    assert _everything(gate) == before


def test_requests_ahead_take_their_room_first(plain: Quotagate, clock: ManualClock) -> None:
    gate = plain
    gate.submit("job-0", "team-a", {"gpu": 1})
    gate.submit("job-1", "team-a", {"gpu": 1})
    clock.advance(1)
    before = _everything(gate)
    answer = gate.simulate("team-a", {"gpu": 1})
    # Nothing is charged yet, but the two ahead of it will take the tenant's 2 gpu.
    assert answer["admissible"] is False and answer["position"] == 3
    assert _codes(answer) == [("tenant_quota", "gpu", 1, 0)]
    # A higher priority puts it ahead of them: then it fits.
    assert gate.simulate("team-a", {"gpu": 1}, priority=5)["admissible"] is True
    assert _everything(gate) == before


def test_a_pool_without_room_is_named(plain: Quotagate) -> None:
    gate = plain
    gate.set_tenant("team-b", {"gpu": 8})
    gate.submit("a-0", "team-a", {"gpu": 2})
    gate.admit()
    answer = gate.simulate("team-b", {"gpu": 3})
    assert _codes(answer) == [("pool_capacity", "gpu", 3, 2)]


def test_a_member_is_told_its_borrowing_limit_and_its_cohorts_room(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_cohort("research")
    gate.set_tenant("team-a", {"gpu": 2}, cohort="research", borrowing_limit={"gpu": 1})
    gate.set_tenant("team-b", {"gpu": 2}, cohort="research")
    assert gate.simulate("team-a", {"gpu": 3})["admissible"] is True  # 1 borrowed
    with pytest.raises(InvalidInput) as beyond:  # more than nominal + borrowing limit, ever
        gate.simulate("team-a", {"gpu": 4})
    assert (beyond.value.code, beyond.value.fields["limit"]) == ("cost_above_quota", 3)
    for index in range(2):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1})
    gate.admit_until_idle()
    before = _everything(gate)
    # b uses its own 2: a has only its own 2 left.
    assert _codes(gate.simulate("team-a", {"gpu": 3})) == [("cohort_capacity", "gpu", 3, 2)]
    assert _everything(gate) == before


def test_an_empty_bucket_is_rate_limited_and_no_token_is_taken(plain: Quotagate) -> None:
    gate = plain
    gate.set_rate("team-a", "capacity=1,refill=0")
    assert gate.simulate("team-a", {"gpu": 1})["admissible"] is True
    gate.submit("job-0", "team-a", {"gpu": 1})
    before = _everything(gate)
    answer = gate.simulate("team-a", {"gpu": 1})
    assert _codes(answer) == [("rate_limited", "tokens", 1, 0)]
    assert _everything(gate) == before


def test_a_request_beyond_the_admission_window_waits_for_the_head(
    gate: Quotagate, clock: ManualClock
) -> None:
    with Quotagate.connect(str(gate.engine.url.render_as_string(hide_password=False)),
                           clock=clock, admission_window=2) as narrow:
        narrow.set_pool("pool-1", {"gpu": 8})
        narrow.set_tenant("team-a", {"gpu": 8})
        for index in range(2):
            narrow.submit(f"big-{index}", "team-a", {"gpu": 8})
        narrow.set_tenant("team-a", {"gpu": 4})  # the bigs never fit now
        clock.advance(1)
        answer = narrow.simulate("team-a", {"gpu": 1})
        assert _codes(answer) == [("queue_window", "queue", 3, 2)]


def test_explain_gives_the_same_reasons_as_the_dry_run(plain: Quotagate, clock: ManualClock) -> None:
    gate = plain
    gate.submit("job-0", "team-a", {"gpu": 2})
    gate.admit()
    clock.advance(1)
    simulated = gate.simulate("team-a", {"gpu": 1, "cpu": 1})
    gate.submit("job-1", "team-a", {"gpu": 1, "cpu": 1})
    explained = gate.explain("job-1")
    assert explained["reasons"] == simulated["reasons"] == [
        {"code": "tenant_quota", "resource": "gpu", "needed": 1, "available": 0}]
    assert explained["admissible"] is False


def test_a_plain_tenants_request_behind_its_own_earlier_ones_says_so(
    plain: Quotagate, clock: ManualClock
) -> None:
    # Nothing is charged yet, so today's usage has room for late; but the next pass
    # admits early-0 and early-1 first, and they take the tenant's 2 gpu.
    gate = plain
    gate.submit("early-0", "team-a", {"gpu": 1})
    gate.submit("early-1", "team-a", {"gpu": 1})
    clock.advance(1)
    gate.submit("late", "team-a", {"gpu": 1})
    explained = gate.explain("late")
    assert explained["admissible"] is False
    assert explained["fitting_pools"] == ["pool-1"] and explained["tenant_blocked_by"] == []
    sentence = ("behind 2 earlier requests of its tenant (early-0, early-1), which the next "
                "admission pass admits first; then tenant_quota: gpu needs 1, 0 available")
    assert explained["reason"] == sentence
    # The dashboard shares the sentence, for an operator and in the tenant's own scope.
    for scope in (None, "team-a"):
        reasons = {entry.id: entry.reason for entry in gate.dashboard(scope).queue}
        assert reasons["late"] == sentence
        assert reasons["early-0"] == gate.explain("early-0")["reason"] == (
            "fits now; it will be admitted by the next admission pass")
    assert sorted(placement.id for placement in gate.admit(16)) == ["early-0", "early-1"]


def test_a_request_other_tenants_heads_leave_no_pool_room_for_says_so(
    plain: Quotagate, clock: ManualClock
) -> None:
    gate = plain
    gate.set_tenant("team-b", {"gpu": 4})
    gate.submit("b-0", "team-b", {"gpu": 4})
    clock.advance(1)
    gate.submit("a-0", "team-a", {"gpu": 1})
    explained = gate.explain("a-0")
    assert explained["admissible"] is False
    assert explained["reason"] == (
        "fits today's usage, but the next admission pass places other tenants' requests "
        "first; then pool_capacity: gpu needs 1, 0 available")
    reasons = {entry.id: entry.reason for entry in gate.dashboard().queue}
    assert reasons["a-0"] == explained["reason"]


def test_explain_of_a_member_speaks_of_its_cohort(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_cohort("research")
    gate.set_tenant("team-a", {"gpu": 1}, cohort="research", borrowing_limit={"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 2}, cohort="research")  # the room: 1 + 2
    gate.submit("a-0", "team-a", {"gpu": 3})
    gate.set_tenant("team-a", {"gpu": 1}, borrowing_limit={"gpu": 1})  # lowered under it
    explained = gate.explain("a-0")
    assert explained["reasons"] == [
        {"code": "borrowing_limit", "resource": "gpu", "needed": 3, "available": 2}]
    assert explained["reason"] == (
        "borrowing_limit: gpu needs 3, 2 available; its limits and its cohort's shared room "
        "allow at most gpu=2: it cannot be admitted until they are raised")


def test_what_submit_refuses_the_dry_run_refuses(plain: Quotagate) -> None:
    gate = plain
    gate.submit("job-0", "team-a", {"gpu": 1})
    before = _everything(gate)
    with pytest.raises(NotFound) as unknown_tenant:
        gate.simulate("team-z", {"gpu": 1})
    assert unknown_tenant.value.code == "unknown_tenant"
    with pytest.raises(InvalidInput) as unknown_resource:
        gate.simulate("team-a", {"tpu": 1})
    assert unknown_resource.value.code == "unknown_resource"
    with pytest.raises(InvalidInput):
        gate.simulate("team-a", {"gpu": 0})
    with pytest.raises(Conflict) as exists:
        gate.simulate("team-a", {"gpu": 1}, request_id="job-0")
    assert exists.value.code == "request_exists"
    assert _everything(gate) == before
