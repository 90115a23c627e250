"""Budgets: resource-hours per rolling window, accrued from admission to release, on every
backend (docs/fair-sharing.md#budgets)."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.domain.budget import CARRIED
from quotagate.errors import InvalidInput
from quotagate.store import schema
from support import budget_workers
from support.ledger_state import snapshot
from support.racing import race

HOUR = 3600.0


def _budget(gate: Quotagate, tenant: str = "team-a", resource: str = "gpu") -> dict[str, Any]:
    state: dict[str, Any] = gate.tenant(tenant)["budget"][resource]
    return state


def _buckets(gate: Quotagate) -> list[tuple[Any, ...]]:
    usage = schema.budget_usage
    with gate.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(
            sa.select(usage.c.tenant, usage.c.resource, usage.c.bucket, usage.c.amount)
            .order_by(usage.c.tenant, usage.c.resource, usage.c.bucket))]


@pytest.fixture
def budgeted(gate: Quotagate, clock: ManualClock) -> Quotagate:
    # Start on an hour boundary, so bucket arithmetic is easy to read.
    clock.advance(HOUR - clock.now() % HOUR)
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_tenant("team-a", {"gpu": 16}, budget={"gpu": "10h/1d"})
    return gate


def test_usage_accrues_exactly_from_admission_to_release(
    budgeted: Quotagate, clock: ManualClock
) -> None:
    gate = budgeted
    start = clock.now()
    gate.submit("job-1", "team-a", {"gpu": 2}, max_runtime="2h")
    clock.advance(600)  # waiting time is not usage
    assert [placement.id for placement in gate.admit()] == ["job-1"]
    state = _budget(gate)
    assert state["reserved_ahead_hours"] == 4.0 and state["spent_hours"] == 0.0
    clock.advance(1800)
    running = _budget(gate)
    assert running["spent_hours"] == 1.0  # 2 gpu x 30 min, while it runs
    assert running["left_hours"] == 10.0 - 1.0 - 3.0  # what it will still accrue is held
    clock.advance(3600 + 123)
    gate.complete("job-1")
    state = _budget(gate)
    seconds = 1800 + 3600 + 123
    assert state["spent_hours"] == round(2 * seconds / HOUR, 3)
    assert state["reserved_ahead_hours"] == 0.0
    # Admitted at start + 600: 3000 s in the first hour, 2523 s in the second.
    assert _buckets(gate) == [("team-a", "gpu", start, 2 * 3000.0),
                              ("team-a", "gpu", start + HOUR, 2 * 2523.0)]
    assert gate.check_invariants() == []


def test_a_request_beyond_the_budget_waits_with_budget_exhausted(
    budgeted: Quotagate, clock: ManualClock
) -> None:
    gate = budgeted
    gate.submit("big", "team-a", {"gpu": 4}, max_runtime="2h")  # reserves 8 of 10 hours
    gate.admit()
    gate.submit("next", "team-a", {"gpu": 2}, max_runtime="2h")  # 4 more: does not fit
    assert gate.admit() == []
    explained = gate.explain("next")
    assert explained["admissible"] is False
    assert explained["reasons"] == [{"code": "budget_exhausted", "resource": "gpu",
                                     "needed": 4.0, "available": 2.0}]
    answer = gate.simulate("team-a", {"gpu": 1}, max_runtime="1h")
    assert answer["admissible"] is True  # 1 gpu-hour fits in the 2 left
    answer = gate.simulate("team-a", {"gpu": 1}, max_runtime="3h")
    assert answer["reasons"] == [{"code": "budget_exhausted", "resource": "gpu",
                                  "needed": 3.0, "available": 2.0}]
    clock.advance(HOUR)
    gate.complete("big")  # 4 gpu-hours spent, the other 4 reserved come back
    assert [placement.id for placement in gate.admit()] == ["next"]
    state = _budget(gate)
    assert (state["spent_hours"], state["reserved_ahead_hours"], state["left_hours"]) == (
        4.0, 4.0, 2.0)
    assert gate.check_invariants() == []


def test_the_tenant_default_max_runtime_is_reserved_when_none_is_declared(
    budgeted: Quotagate,
) -> None:
    gate = budgeted
    gate.set_tenant("team-a", {}, default_max_runtime="3h")
    gate.submit("a", "team-a", {"gpu": 3})  # 9 hours reserved
    gate.submit("b", "team-a", {"gpu": 1})  # 3 more: over
    assert [placement.id for placement in gate.admit(4)] == ["a"]
    assert gate.explain("b")["reasons"][0]["code"] == "budget_exhausted"
    # A declared max-runtime wins over the default.
    gate.submit("c", "team-a", {"gpu": 1}, max_runtime="30m")
    assert [placement.id for placement in gate.admit(4)] == ["c"]


def test_without_any_max_runtime_a_request_needs_only_something_left(
    budgeted: Quotagate, clock: ManualClock
) -> None:
    gate = budgeted
    gate.submit("open-ended", "team-a", {"gpu": 8})
    assert len(gate.admit()) == 1
    clock.advance(2 * HOUR)  # 16 gpu-hours: more than the budget (docs/decisions/711)
    gate.complete("open-ended")
    assert _budget(gate)["spent_hours"] == 16.0 and _budget(gate)["left_hours"] == 0.0
    gate.submit("after", "team-a", {"gpu": 1})
    assert gate.admit() == []
    assert gate.explain("after")["reasons"] == [
        {"code": "budget_exhausted", "resource": "gpu", "needed": 0.0, "available": 0.0}]


def test_work_running_past_its_max_runtime_keeps_accruing(
    budgeted: Quotagate, clock: ManualClock
) -> None:
    gate = budgeted
    gate.submit("slow", "team-a", {"gpu": 1}, max_runtime="1h")
    gate.admit()
    clock.advance(3 * HOUR)
    assert _budget(gate)["spent_hours"] == 3.0
    gate.complete("slow")
    assert _budget(gate)["spent_hours"] == 3.0
    assert gate.check_invariants() == []


def test_usage_leaves_the_rolling_window(gate: Quotagate, clock: ManualClock) -> None:
    clock.advance(HOUR - clock.now() % HOUR)
    gate.set_pool("pool-1", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 4}, budget={"gpu": "2h/2h"})
    gate.submit("first", "team-a", {"gpu": 2}, max_runtime="1h")
    gate.admit()
    clock.advance(HOUR)
    gate.complete("first")
    assert gate.simulate("team-a", {"gpu": 1}, max_runtime="1h")["admissible"] is False
    frees_at = _budget(gate)["frees_at"]
    assert frees_at == clock.now() - HOUR + HOUR + 2 * HOUR  # its hour ends, plus the window
    clock.advance(frees_at - clock.now() - 1)
    gate.submit("second", "team-a", {"gpu": 1}, max_runtime="1h")  # (within the queue TTL)
    assert gate.admit() == []
    clock.advance(1)
    assert [placement.id for placement in gate.admit()] == ["second"]


def _run(gate: Quotagate, clock: ManualClock, request_id: str, gpu: int, hours: float) -> None:
    gate.submit(request_id, "team-a", {"gpu": gpu})
    assert [placement.id for placement in gate.admit()] == [request_id]
    clock.advance(hours * HOUR)
    gate.complete(request_id)


def test_buckets_no_window_counts_are_folded_and_what_counts_is_unchanged(
    budgeted: Quotagate, clock: ManualClock
) -> None:
    gate = budgeted  # gpu=10h/1d
    start = clock.now()
    _run(gate, clock, "old", 1, 1)  # bucket start
    clock.advance(4 * HOUR)
    _run(gate, clock, "edge", 1, 1)  # bucket start + 5h
    _run(gate, clock, "margin", 1, 1)  # bucket start + 6h
    clock.advance(23 * HOUR)
    # Reserved for the hour it runs: admission counts it the same before and after.
    gate.submit("now", "team-a", {"gpu": 2}, max_runtime="1h")
    gate.admit()
    clock.advance(HOUR)  # start + 31h: the window counts buckets from start + 7h
    assert len(_buckets(gate)) == 3
    shown = _budget(gate)
    assert (shown["spent_hours"], shown["left_hours"]) == (2.0, 8.0)  # "now" running
    fits = gate.simulate("team-a", {"gpu": 1}, max_runtime="8h")
    too_much = gate.simulate("team-a", {"gpu": 1}, max_runtime="481m")
    assert fits["admissible"] is True and too_much["admissible"] is False
    assert gate.check_invariants() == []

    # Its release makes a new bucket: the buckets before start + 6h (the window's
    # first, less an hour for slower clocks) are folded into the carried bucket.
    gate.complete("now")
    assert _buckets(gate) == [("team-a", "gpu", CARRIED, 2 * 3600),
                              ("team-a", "gpu", start + 6 * HOUR, 3600),
                              ("team-a", "gpu", start + 30 * HOUR, 2 * 3600)]
    assert _budget(gate) == {**shown, "frees_at": start + 31 * HOUR + 24 * HOUR}
    assert gate.simulate("team-a", {"gpu": 1}, max_runtime="8h") == fits
    assert gate.simulate("team-a", {"gpu": 1}, max_runtime="481m") == too_much
    # check recounts accrued against the buckets, the carried one included.
    assert gate.check_invariants() == []
    # Later folds add to the carried bucket.
    clock.advance(30 * HOUR)
    _run(gate, clock, "later", 1, 1)
    assert _buckets(gate) == [("team-a", "gpu", CARRIED, 5 * 3600),
                              ("team-a", "gpu", start + 61 * HOUR, 3600)]
    assert _budget(gate)["spent_hours"] == 1.0
    assert gate.check_invariants() == []


def test_setting_removing_and_bad_budgets(budgeted: Quotagate, clock: ManualClock) -> None:
    gate = budgeted
    gate.set_tenant("team-b", {"gpu": 4})
    gate.submit("run", "team-b", {"gpu": 2}, max_runtime="1h")
    gate.admit()
    # A budget set while work runs counts that work's reservation at once.
    gate.set_tenant("team-b", {}, budget={"gpu": "3h/1d"})
    assert _budget(gate, "team-b")["reserved_ahead_hours"] == 2.0
    assert gate.check_invariants() == []
    before = snapshot(gate)
    for bad in ("100h", "1h/30m", "0h/1d", "5h/500d"):
        with pytest.raises(InvalidInput) as refused:
            gate.set_tenant("team-b", {"gpu": 8}, budget={"gpu": bad})
        assert refused.value.code == "invalid_budget"
    with pytest.raises(InvalidInput) as refused:
        gate.submit("bad", "team-b", {"gpu": 1}, max_runtime="soon")
    assert refused.value.code == "invalid_max_runtime"
    assert snapshot(gate) == before
    gate.set_tenant("team-b", {}, budget={"gpu": None})
    assert gate.tenant("team-b")["budget"] == {}
    gate.set_tenant("team-a", {}, clear_budgets=True)
    assert gate.tenant("team-a")["budget"] == {}
    assert gate.check_invariants() == []


def test_a_replay_with_another_max_runtime_conflicts(budgeted: Quotagate) -> None:
    gate = budgeted
    gate.submit("job", "team-a", {"gpu": 1}, max_runtime="1h")
    assert gate.show("job").max_runtime == 3600
    assert gate.submit("job", "team-a", {"gpu": 1}, max_runtime=3600).created is False
    with pytest.raises(Exception, match="max_runtime"):
        gate.submit("job", "team-a", {"gpu": 1}, max_runtime="2h")


def test_several_admitting_processes_never_overshoot_a_budget(db_url: str) -> None:
    """8 processes admit one at a time: exactly what the budget allows is admitted."""
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 100})
        gate.set_tenant("team-a", {"gpu": 100}, budget={"gpu": "10h/1d"})
        gate.set_tenant("team-b", {"gpu": 100}, budget={"gpu": "7h/1d"})
        for index in range(30):
            gate.submit(f"a-{index}", "team-a", {"gpu": 1}, max_runtime="1h")
            gate.submit(f"b-{index}", "team-b", {"gpu": 2}, max_runtime="1h")
    answers = race(budget_workers.admit_all, db_url, processes=8)
    admitted = [request_id for answer in answers for request_id in answer]
    assert len(admitted) == len(set(admitted))
    assert sorted(request_id[0] for request_id in admitted).count("a") == 10
    assert sorted(request_id[0] for request_id in admitted).count("b") == 3  # 6 of 7 hours
    with Quotagate.connect(db_url) as gate:
        assert gate.check_invariants() == []
        assert gate.tenant("team-a")["budget"]["gpu"]["reserved_ahead_hours"] <= 10.0


def test_admitters_racing_releasers_keep_the_budget(db_url: str) -> None:
    """6 processes admit and release at once: what was spent plus what is reserved never
    passes the budget, and every release's usage is in the buckets."""
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 100})
        gate.set_tenant("team-a", {"gpu": 100}, budget={"gpu": "2h/1d"})
        for index in range(200):
            gate.submit(f"a-{index}", "team-a", {"gpu": 1}, max_runtime="30m")
    admitted = sum(race(budget_workers.admit_and_release, db_url, 15, processes=6))
    assert admitted > 4  # releases gave reservations back: more than 2h / 30m were admitted
    budget, usage = schema.tenant_budget, schema.budget_usage
    with Quotagate.connect(db_url) as gate, gate.engine.connect() as connection:
        reserved, accrued, amount = connection.execute(
            sa.select(budget.c.reserved, budget.c.accrued, budget.c.amount)).one()
        spent = connection.execute(sa.select(sa.func.sum(usage.c.amount))).scalar_one()
        assert int(spent) == accrued and reserved + accrued <= amount
        completed = connection.execute(
            sa.select(sa.func.count()).select_from(schema.request)
            .where(schema.request.c.state == "completed")).scalar_one()
        assert completed == admitted
        assert gate.check_invariants() == []


def test_a_sigkilled_admitter_loses_no_accrual(db_url: str) -> None:
    """Accrual runs from the admission time stored with the request: whoever releases it
    later, after the process that admitted it died, accrues the whole time held."""
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 4})
        gate.set_tenant("team-a", {"gpu": 4}, budget={"gpu": "100h/1d"})
        gate.submit("job", "team-a", {"gpu": 3}, max_runtime="1h")
    context = multiprocessing.get_context("spawn")
    admitted: Any = context.Queue()
    child = context.Process(target=budget_workers.admit_and_die, args=(db_url, admitted),
                            daemon=True)
    child.start()
    assert admitted.get(timeout=120) == ["job"]
    child.join(timeout=60)
    assert child.exitcode == -9
    with Quotagate.connect(db_url) as gate:
        with gate.engine.connect() as connection:
            at = connection.execute(sa.select(schema.request.c.admitted)
                                    .where(schema.request.c.id == "job")).scalar_one()
        clock = ManualClock(at + 5400)
    with Quotagate.connect(db_url, clock=clock) as gate:
        gate.complete("job")
        assert _budget(gate)["spent_hours"] == 4.5  # 3 gpu x 1.5 h
        assert gate.check_invariants() == []


def test_no_work_is_preempted_for_a_request_its_budget_keeps_waiting(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 1})
    gate.set_tenant("team-a", {"gpu": 1}, within_tenant="lower-priority",
                    budget={"gpu": "2h/1d"})
    gate.submit("low", "team-a", {"gpu": 1}, max_runtime="1h")
    gate.admit()
    gate.submit("high", "team-a", {"gpu": 1}, priority=5, max_runtime="3h")  # over the budget
    assert gate.admit() == []
    assert gate.show("low").state.value == "reserved"
    assert gate.simulate("team-a", {"gpu": 1}, priority=5, max_runtime="3h")[
        "reasons"][0]["code"] == "budget_exhausted"
