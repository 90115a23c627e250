"""Preemption through the stop protocol: reclaim and within-tenant, on every backend."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from quotagate import ManualClock, Quotagate
from quotagate.errors import Conflict, InvalidInput
from support.stops import confirm as _confirm
from support.stops import state as _state
from support.stops import used as _used


@pytest.fixture
def borrowed(gate: Quotagate, clock: ManualClock) -> Quotagate:
    """team-b borrows all of team-a's nominal; team-a may reclaim."""
    gate.set_pool("pool-1", {"gpu": 8})
    gate.set_cohort("org")
    gate.set_tenant("team-a", {"gpu": 2}, cohort="org", reclaim="any")
    gate.set_tenant("team-b", {"gpu": 2}, cohort="org")
    for index in range(4):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1}, priority=index % 2)
        clock.advance(1)
        gate.admit()
    assert _used(gate, "team-b") == 4
    return gate


def test_reclaim_stops_only_borrowed_work_and_admits_after_the_cost_is_back(
    borrowed: Quotagate,
) -> None:
    gate = borrowed
    gate.submit("a-0", "team-a", {"gpu": 2})
    assert gate.admit() == []
    # Lowest priority first (b-0, b-2 have priority 0), then the most recently admitted.
    victims = [f"b-{index}" for index in range(4) if _state(gate, f"b-{index}") == "preempting"]
    assert victims == ["b-0", "b-2"]
    assert gate.show("b-2").reason == "preempted (reclaim) by a-0"
    # Still charged while stopping: the preemptor waits; passes choose nothing more.
    for _ in range(3):
        assert gate.admit() == []
    assert _used(gate, "team-b") == 4 and _state(gate, "a-0") == "waiting"
    assert gate.check_invariants() == []
    assert _confirm(gate, "b-2") == {"gpu": 1}
    assert gate.admit() == []  # one victim back is not enough room yet
    assert _confirm(gate, "b-0") == {"gpu": 1}
    assert [placement.id for placement in gate.admit()] == ["a-0"]
    assert [_state(gate, victim) for victim in victims] == ["preempted", "preempted"]
    assert gate.check_invariants() == []


def test_reclaim_lower_priority_spares_work_of_equal_priority(borrowed: Quotagate) -> None:
    gate = borrowed
    gate.set_tenant("team-a", {}, reclaim="lower-priority")
    gate.submit("a-0", "team-a", {"gpu": 2}, priority=1)
    assert gate.admit() == []
    stopping = sorted(f"b-{index}" for index in range(4)
                      if _state(gate, f"b-{index}") == "preempting")
    assert stopping == ["b-0", "b-2"]
    gate.submit("a-1", "team-a", {"gpu": 1}, priority=0)
    # Nothing of lower priority than a-1 is left running: nothing more is stopped.
    assert gate.admit() == [] and sum(
        _state(gate, f"b-{index}") == "preempting" for index in range(4)) == 2


def test_a_tenant_above_its_nominal_does_not_reclaim(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 4})
    gate.set_cohort("org")
    gate.set_tenant("team-a", {"gpu": 1}, cohort="org", reclaim="any")
    gate.set_tenant("team-b", {"gpu": 3}, cohort="org")
    for index in range(4):
        gate.submit(f"b-{index}", "team-b", {"gpu": 1})
    gate.admit_until_idle()
    gate.submit("a-big", "team-a", {"gpu": 2})  # more than its nominal: not a reclaim
    assert gate.admit() == []
    assert all(_state(gate, f"b-{index}") == "reserved" for index in range(4))


def test_within_tenant_lower_priority_work_makes_way(gate: Quotagate, clock: ManualClock) -> None:
    gate.set_pool("pool-1", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 2}, within_tenant="lower-priority")
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    clock.advance(1)
    gate.submit("same", "team-a", {"gpu": 2}, priority=0)
    assert gate.admit() == [] and _state(gate, "low") == "reserved"  # equal: no preemption
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    assert gate.admit() == [] and _state(gate, "low") == "preempting"
    with pytest.raises(Conflict):
        gate.complete("low")  # only the confirmed stop ends it
    assert gate.cancel("low").released == {}  # already stopping
    assert _confirm(gate, "low") == {"gpu": 2}
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _state(gate, "low") == "preempted" and gate.check_invariants() == []


def test_a_bad_policy_is_refused(gate: Quotagate) -> None:
    with pytest.raises(InvalidInput) as refused:
        gate.set_tenant("team-a", {"gpu": 1}, reclaim="sometimes")
    assert refused.value.code == "invalid_reclaim"
    with pytest.raises(InvalidInput):
        gate.set_tenant("team-a", {"gpu": 1}, within_tenant="any")


def test_racing_confirmations_return_a_victims_cost_exactly_once(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 4})
        gate.set_tenant("team-a", {"gpu": 3}, within_tenant="lower-priority")
        gate.submit("low", "team-a", {"gpu": 3}, priority=0)
        gate.admit()
        gate.submit("high", "team-a", {"gpu": 2}, priority=9)
        assert gate.admit() == [] and _state(gate, "low") == "preempting"
    from support import cohort_workers
    from support.racing import race

    released = race(cohort_workers.confirm_stop, db_url, "low", processes=4)
    assert sorted(released, key=len) == [{}, {}, {}, {"gpu": 3}]
    with Quotagate.connect(db_url) as gate:
        assert _used(gate, "team-a") == 0 and _state(gate, "low") == "preempted"
        assert [placement.id for placement in gate.admit()] == ["high"]
        assert gate.check_invariants() == []


def test_a_running_victim_is_stopped_by_the_delivery_engine_before_the_preemptor_runs(
    gate: Quotagate, tmp_path: Path
) -> None:
    """The whole way: a real process runs the victim; the worker's stop ends it."""
    from quotagate.delivery.dispatcher import Dispatcher
    from support.waiting import wait_for

    gate.set_target(
        "local", "process",
        {"command": ["sh", "-c", "sleep 60"], "run_dir": str(tmp_path / "runs")}, default=True)
    gate.set_pool("pool-1", {"gpu": 2})
    gate.set_tenant("team-a", {"gpu": 2}, within_tenant="lower-priority")
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.05)
    dispatcher.run_once()
    [run] = sorted(path for path in (tmp_path / "runs").iterdir()
                   if not path.name.startswith("."))
    wait_for(lambda: (run / "pid").exists() and (run / "pid").read_text(), "the victim to run")
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    assert gate.admit() == [] and _state(gate, "low") == "preempting"
    assert gate.admit() == []  # the victim still runs: no overlap on the cost
    wait_for(lambda: dispatcher.run_once() is not None
             and _state(gate, "low") == "preempted", "the victim's confirmed stop")
    assert (run / "exit_status").exists()
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert gate.check_invariants() == []
    dispatcher.release()


def test_the_dry_run_names_what_it_would_preempt_and_stops_nothing(borrowed: Quotagate) -> None:
    gate = borrowed
    answer = gate.simulate("team-a", {"gpu": 1})
    assert answer["admissible"] is False
    assert [victim["id"] for victim in answer["would_preempt"]] == ["b-2"]
    assert answer["would_preempt"][0]["kind"] == "reclaim"
    assert all(_state(gate, f"b-{index}") == "reserved" for index in range(4))


@pytest.mark.slow
@pytest.mark.parametrize("on_preempt", ["fail", "requeue"])
def test_several_admitters_reclaim_exactly_what_is_borrowed(db_url: str, on_preempt: str) -> None:
    from support import cohort_workers
    from support.waiting import wait_for

    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 8})
        gate.set_cohort("org")
        gate.set_tenant("team-a", {"gpu": 4}, cohort="org", reclaim="any")
        gate.set_tenant("team-b", {"gpu": 4}, cohort="org", on_preempt=on_preempt)
        for index in range(8):
            gate.submit(f"b-{index}", "team-b", {"gpu": 1})
        assert gate.admit_until_idle() == 8
        gate.submit("a-0", "team-a", {"gpu": 2})
        gate.submit("a-1", "team-a", {"gpu": 2})
    context = multiprocessing.get_context("spawn")
    finished = context.Event()
    results: multiprocessing.Queue[int] = context.Queue()
    processes = [context.Process(target=cohort_workers.admit_until,
                                 args=(db_url, finished, 2, results)) for _ in range(4)]
    processes.append(context.Process(target=cohort_workers.confirm_stops_until,
                                     args=(db_url, finished, results)))
    for process in processes:
        process.start()
    try:
        with Quotagate.connect(db_url) as gate:
            wait_for(lambda: all(_state(gate, f"a-{index}") == "reserved" for index in range(2)),
                     "both of team-a's requests to be admitted", timeout=120)
    finally:
        finished.set()
        counts = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=60)
    assert all(process.exitcode == 0 for process in processes)
    with Quotagate.connect(db_url) as gate:
        states = [_state(gate, f"b-{index}") for index in range(8)]
        # Exactly the 4 borrowed units were taken back: never more than needed (requeued
        # victims wait: team-b is back at its nominal, and the room is team-a's).
        ended = "preempted" if on_preempt == "fail" else "waiting"
        assert states.count(ended) == 4 and states.count("reserved") == 4
        assert _used(gate, "team-a") == 4 and _used(gate, "team-b") == 4
        assert sum(counts) == 2 + 4  # admissions of a, and confirmed stops
        assert gate.check_invariants() == []
