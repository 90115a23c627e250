"""Preemption and work whose stop is already under way, on every backend: work stopping at
its max-runtime (``timing_out``, docs/decisions/714) and work being cancelled
(``cancelling``, 716) is coming back, never a victim, and its confirmed stop never lets
the same room be spent twice."""

from __future__ import annotations

from typing import Any

import pytest

from quotagate import Quotagate
from quotagate.store import schema
from quotagate.store.overruns import stop_overruns
from support import cohort_workers
from support.racing import race_mixed
from support.stops import confirm as _confirm
from support.stops import state as _state
from support.stops import used as _used
from support.worker_processes import table

# How the stop began → the state it ends in once confirmed, and its reason.
ENDS = {"timing_out": ("timed_out", "max_runtime 1s exceeded"),
        "cancelling": ("cancelled", None)}


def _audit(gate: Quotagate, operation: str) -> list[dict[str, Any]]:
    return [row for row in table(gate, schema.audit) if row["operation"] == operation]


def _running_out(gate: Quotagate, stopping: str, stopping_priority: int = 0) -> None:
    """team-a runs ``stopping`` (2 gpu, its stop begun: past its 1 s max-runtime, or
    cancelled) and ``running`` (2 gpu, no limit, priority 0), filling the pool of 4. At
    equal priority ``stopping`` comes first in the victims' order (admitted together, or
    later): it would be chosen if it were a victim at all. Whatever the clock, the look
    for overruns is made 5 s ahead."""
    gate.set_pool("pool-1", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority",
                    stop_at_max_runtime=True)
    gate.submit("running", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    gate.submit("stopping", "team-a", {"gpu": 2}, priority=stopping_priority, max_runtime=1)
    gate.admit()
    if stopping == "timing_out":
        ahead = gate.clock.now() + 5
        assert stop_overruns(gate.engine, ahead, actor="worker:w1") == ["stopping"]
    else:
        gate.cancel("stopping")
    assert _state(gate, "stopping") == stopping and _used(gate, "team-a") == 4


@pytest.fixture(params=sorted(ENDS))
def stopping(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def running_out(gate: Quotagate, stopping: str) -> Quotagate:
    _running_out(gate, stopping)
    return gate


def test_stopping_work_is_never_a_victim(running_out: Quotagate, stopping: str) -> None:
    gate = running_out
    gate.submit("high", "team-a", {"gpu": 4}, priority=5)
    assert gate.admit() == []
    # The stopping work's 2 gpu are coming back; the other 2 must be preempted: only "running".
    assert _state(gate, "running") == "preempting"
    assert _state(gate, "stopping") == stopping
    assert [row["target"] for row in _audit(gate, "preempt")] == ["running"]
    assert gate.check_invariants() == []
    assert _confirm(gate, "running") == {"gpu": 2}
    assert gate.admit() == []  # the stopping work still holds its 2 gpu
    assert _confirm(gate, "stopping") == {"gpu": 2}
    ended = gate.show("stopping")  # not preempted: its own stop ended it
    assert (ended.state.value, ended.reason) == ENDS[stopping]
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _used(gate, "team-a") == 4 and gate.check_invariants() == []


def test_a_preemptor_that_fits_once_stopping_work_is_back_stops_nothing(
    gate: Quotagate, stopping: str
) -> None:
    # "running" is the first victim here: had the stopping work's cost not been counted
    # as coming back, it would be stopped for "high" — a needless victim.
    _running_out(gate, stopping, stopping_priority=1)
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    for _ in range(3):  # every pass waits for the stopping work's cost
        assert gate.admit() == []
    assert _state(gate, "running") == "reserved" and _audit(gate, "preempt") == []
    assert table(gate, schema.hold) == []
    assert _confirm(gate, "stopping") == {"gpu": 2}
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _state(gate, "running") == "reserved"
    assert _used(gate, "team-a") == 4 and gate.check_invariants() == []


def _held_with_stopping_work(gate: Quotagate, stopping: str) -> None:
    """``high`` needs the whole pool: the stopping work's room and ``running``'s,
    preempted for it (its room held); team-c waits with ``other``, which fits any 2 free
    gpu."""
    _running_out(gate, stopping)
    gate.set_tenant("team-c", {"gpu": 4})
    gate.submit("high", "team-a", {"gpu": 4}, priority=5)
    assert gate.admit() == [] and _state(gate, "running") == "preempting"
    assert [row["request_id"] for row in table(gate, schema.hold)] == ["high"]
    gate.submit("other", "team-c", {"gpu": 2})


def test_the_room_held_for_a_preemptor_counts_stopping_work_as_coming_back(
    gate: Quotagate, stopping: str
) -> None:
    """The hold keeps the victim's room for the preemptor while the stopping work it also
    counted on has not come back yet (the guard judges as the decision did)."""
    _held_with_stopping_work(gate, stopping)
    assert _confirm(gate, "running") == {"gpu": 2}
    # 2 gpu free now, but they are high's once the stopping work is back: other waits.
    assert gate.admit() == [] and _state(gate, "other") == "waiting"
    assert gate.simulate("team-c", {"gpu": 2})["admissible"] is False
    assert _confirm(gate, "stopping") == {"gpu": 2}
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _state(gate, "other") == "waiting" and table(gate, schema.hold) == []
    assert gate.check_invariants() == []


@pytest.mark.slow
def test_confirmed_stops_racing_admissions_never_spend_the_held_room_twice(
    db_url: str, stopping: str
) -> None:
    # The real clock: the admitters' processes judge the hold's expiry on it.
    with Quotagate.connect(db_url) as gate:
        _held_with_stopping_work(gate, stopping)
    # Both stops confirmed while three admitters decide (and preempt, if they would).
    jobs: list[tuple[Any, tuple[Any, ...]]] = [
        (cohort_workers.confirm_stop, (db_url, "running")),
        (cohort_workers.confirm_stop, (db_url, "stopping")),
        *((cohort_workers.admit_once, (db_url,)) for _ in range(3))]
    answers = race_mixed(jobs)
    admitted = [request_id for answer in answers if isinstance(answer, list)
                for request_id in answer]
    assert "other" not in admitted and admitted.count("high") <= 1
    with Quotagate.connect(db_url) as gate:
        gate.admit_until_idle()
        assert _state(gate, "high") == "reserved" and _state(gate, "other") == "waiting"
        assert _state(gate, "stopping") == ENDS[stopping][0]
        assert _state(gate, "running") == "preempted"
        assert [row["target"] for row in _audit(gate, "preempt")] == ["running"]
        assert _used(gate, "team-a") == 4 and _used(gate, "team-c") == 0
        assert gate.check_invariants() == []
