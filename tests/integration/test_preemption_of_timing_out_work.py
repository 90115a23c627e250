"""Preemption and work stopping at its max-runtime, on every backend (docs/decisions/714):
``timing_out`` work is coming back, never a victim, and its confirmed stop never lets
the same room be spent twice."""

from __future__ import annotations

from typing import Any

import pytest

from quotagate import Quotagate
from quotagate.domain.model import RequestState
from quotagate.store import schema
from quotagate.store.overruns import stop_overruns
from support import cohort_workers
from support.racing import race_mixed
from support.stops import confirm as _confirm
from support.stops import state as _state
from support.stops import used as _used
from support.worker_processes import table


def _audit(gate: Quotagate, operation: str) -> list[dict[str, Any]]:
    return [row for row in table(gate, schema.audit) if row["operation"] == operation]


def _running_out(gate: Quotagate, overrun_priority: int = 0) -> None:
    """team-a runs ``overrun`` (2 gpu, past its 1 s max-runtime, now ``timing_out``) and
    ``running`` (2 gpu, no limit, priority 0), filling the pool of 4. At equal priority
    ``overrun`` comes first in the victims' order (admitted together, or later): it
    would be chosen if it were a victim at all. Whatever the clock, the look for
    overruns is made 5 s ahead."""
    gate.set_pool("pool-1", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority",
                    stop_at_max_runtime=True)
    gate.submit("running", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    gate.submit("overrun", "team-a", {"gpu": 2}, priority=overrun_priority, max_runtime=1)
    gate.admit()
    ahead = gate.clock.now() + 5
    assert stop_overruns(gate.engine, ahead, actor="worker:w1") == ["overrun"]
    assert _state(gate, "overrun") == "timing_out" and _used(gate, "team-a") == 4


@pytest.fixture
def running_out(gate: Quotagate) -> Quotagate:
    _running_out(gate)
    return gate


def test_timing_out_work_is_never_a_victim(running_out: Quotagate) -> None:
    gate = running_out
    gate.submit("high", "team-a", {"gpu": 4}, priority=5)
    assert gate.admit() == []
    # The overrun's 2 gpu are coming back; the other 2 must be preempted: only "running".
    assert _state(gate, "running") == "preempting"
    overrun = gate.show("overrun")
    assert overrun.state == RequestState.TIMING_OUT
    assert overrun.reason == "max_runtime 1s exceeded"
    assert [row["target"] for row in _audit(gate, "preempt")] == ["running"]
    assert gate.check_invariants() == []
    assert _confirm(gate, "running") == {"gpu": 2}
    assert gate.admit() == []  # the overrun still holds its 2 gpu
    assert _confirm(gate, "overrun") == {"gpu": 2}
    assert _state(gate, "overrun") == "timed_out"  # not preempted: it stopped at its limit
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _used(gate, "team-a") == 4 and gate.check_invariants() == []


def test_a_preemptor_that_fits_once_timing_out_work_is_back_stops_nothing(
    gate: Quotagate,
) -> None:
    # "running" is the first victim here: had the overrun's cost not been counted as
    # coming back, it would be stopped for "high".
    _running_out(gate, overrun_priority=1)
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    for _ in range(3):  # every pass waits for the overrun's cost
        assert gate.admit() == []
    assert _state(gate, "running") == "reserved" and _audit(gate, "preempt") == []
    assert table(gate, schema.hold) == []
    assert _confirm(gate, "overrun") == {"gpu": 2}
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _state(gate, "running") == "reserved"
    assert _used(gate, "team-a") == 4 and gate.check_invariants() == []


def _held_with_an_overrun(gate: Quotagate) -> None:
    """``high`` needs the whole pool: the overrun's room and ``running``'s, preempted
    for it (its room held); team-c waits with ``other``, which fits any 2 free gpu."""
    _running_out(gate)
    gate.set_tenant("team-c", {"gpu": 4})
    gate.submit("high", "team-a", {"gpu": 4}, priority=5)
    assert gate.admit() == [] and _state(gate, "running") == "preempting"
    assert [row["request_id"] for row in table(gate, schema.hold)] == ["high"]
    gate.submit("other", "team-c", {"gpu": 2})


def test_the_room_held_for_a_preemptor_counts_timing_out_work_as_coming_back(
    gate: Quotagate,
) -> None:
    """The hold keeps the victim's room for the preemptor while the overrun it also
    counted on is still stopping (the guard judges as the decision did)."""
    _held_with_an_overrun(gate)
    assert _confirm(gate, "running") == {"gpu": 2}
    # 2 gpu free now, but they are high's once the overrun is back: other waits.
    assert gate.admit() == [] and _state(gate, "other") == "waiting"
    assert gate.simulate("team-c", {"gpu": 2})["admissible"] is False
    assert _confirm(gate, "overrun") == {"gpu": 2}
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert _state(gate, "other") == "waiting" and table(gate, schema.hold) == []
    assert gate.check_invariants() == []


@pytest.mark.slow
def test_confirmed_stops_racing_admissions_never_spend_the_held_room_twice(
    db_url: str,
) -> None:
    # The real clock: the admitters' processes judge the hold's expiry on it.
    with Quotagate.connect(db_url) as gate:
        _held_with_an_overrun(gate)
    # Both stops confirmed while three admitters decide (and preempt, if they would).
    jobs: list[tuple[Any, tuple[Any, ...]]] = [
        (cohort_workers.confirm_stop, (db_url, "running")),
        (cohort_workers.confirm_stop, (db_url, "overrun")),
        *((cohort_workers.admit_once, (db_url,)) for _ in range(3))]
    answers = race_mixed(jobs)
    admitted = [request_id for answer in answers if isinstance(answer, list)
                for request_id in answer]
    assert "other" not in admitted and admitted.count("high") <= 1
    with Quotagate.connect(db_url) as gate:
        gate.admit_until_idle()
        assert _state(gate, "high") == "reserved" and _state(gate, "other") == "waiting"
        assert _state(gate, "overrun") == "timed_out" and _state(gate, "running") == "preempted"
        assert [row["target"] for row in _audit(gate, "preempt")] == ["running"]
        assert _used(gate, "team-a") == 4 and _used(gate, "team-c") == 0
        assert gate.check_invariants() == []
