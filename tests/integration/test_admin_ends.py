"""An admin's complete or fail of work that may still run, on every SQL backend.

The executor is the authority on whether delivered work runs; an admin's verdict
stops it first and returns the cost once the target confirms the stop, never
before (docs/decisions/819). ``force`` is the override for a lost executor: the
cost back now, audited ``forced`` (docs/decisions/820). Real ``sleep`` commands
under the process target, stopped for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quotagate import Conflict, Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.store import schema
from support.process_runs import (
    alive,
    delivered_run,
    kill_groups,
    process_target,
    run_directories,
    running_group,
)
from support.stops import used
from support.waiting import wait_for
from support.worker_processes import submit_and_admit, table


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 1000})
    gate.set_pool("pool-1", {"gpu": 1000})
    return gate


def audit(gate: Quotagate, request_id: str) -> list[tuple[str, str]]:
    """The request's audit entries after its admission: (operation, outcome), in order."""
    entries = sorted((row for row in table(gate, schema.audit) if row["target"] == request_id),
                     key=lambda row: row["id"])
    return [(row["operation"], row["outcome"]) for row in entries
            if row["operation"] not in ("submit", "admit", "deliver", "delivered")]


def running(gate: Quotagate, tmp_path: Path) -> tuple[str, Dispatcher, int]:
    """One request delivered to ``sleep 60``: its id, the worker (polling stops every
    50 ms) and the command's process group, running."""
    process_target(gate, tmp_path, "sleep 60")
    request_id, dispatcher, run = delivered_run(gate, tmp_path, "pid")
    group = running_group(run)
    assert gate.show(request_id).state == RequestState.DELIVERED and alive(group)
    return request_id, dispatcher, group


@pytest.fixture
def left_running(ledger: Quotagate, tmp_path: Path) -> Iterator[tuple[str, Dispatcher, int]]:
    """:func:`running`, for a test whose forced end leaves the command running: killed after."""
    request_id, dispatcher, group = running(ledger, tmp_path)
    yield request_id, dispatcher, group
    kill_groups([group])


def test_an_admins_complete_of_running_work_holds_the_cost_until_the_stop_is_confirmed(
    ledger: Quotagate, tmp_path: Path
) -> None:
    request_id, dispatcher, group = running(ledger, tmp_path)
    result = ledger.complete(request_id, actor="admin")
    assert result.request.state == RequestState.COMPLETING and result.released == {}
    assert alive(group) and used(ledger, "team-a") == 1  # the work runs: its cost stays charged
    assert ledger.check_invariants() == []
    assert ledger.inspect()["requests"][0]["outbox"] == "stopping"
    assert "completed by an admin; still charged" in ledger.explain(request_id)["reason"]
    # Asked again: nothing more happens; a different verdict is refused, naming force.
    assert ledger.complete(request_id, actor="admin").request.state == RequestState.COMPLETING
    with pytest.raises(Conflict, match=r"completing.*force"):
        ledger.fail(request_id, "oops", actor="admin")

    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.COMPLETED, "the confirmed stop")
    assert not alive(group) and used(ledger, "team-a") == 0
    dispatcher.run_once()  # a confirmation seen again returns nothing more
    assert audit(ledger, request_id) == [("complete", "stopping"), ("completed", "released")]
    assert ledger.check_invariants() == []
    dispatcher.release()


def test_an_admins_fail_of_running_work_ends_failed_with_its_reason_once_stopped(
    ledger: Quotagate, tmp_path: Path
) -> None:
    request_id, dispatcher, group = running(ledger, tmp_path)
    result = ledger.fail(request_id, "bad input data", actor="admin")
    assert result.request.state == RequestState.FAILING and result.released == {}
    assert alive(group) and used(ledger, "team-a") == 1
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.FAILED, "the confirmed stop")
    ended = ledger.show(request_id)
    assert ended.reason == "bad input data" and not alive(group) and used(ledger, "team-a") == 0
    assert audit(ledger, request_id) == [("fail", "stopping"), ("failed", "released")]
    dispatcher.release()


def test_a_forced_complete_returns_the_cost_at_once_and_is_audited_forced(
    ledger: Quotagate, left_running: tuple[str, Dispatcher, int]
) -> None:
    request_id, dispatcher, group = left_running
    result = ledger.complete(request_id, actor="admin", force=True)
    assert result.request.state == RequestState.COMPLETED and result.released == {"gpu": 1}
    assert used(ledger, "team-a") == 0 and ledger.check_invariants() == []
    assert alive(group)  # the oversell force is documented to be: nothing stopped it
    assert audit(ledger, request_id) == [("completed", "forced")]
    dispatcher.release()


def test_force_ends_a_stop_its_lost_executor_never_confirms(
    ledger: Quotagate, left_running: tuple[str, Dispatcher, int]
) -> None:
    request_id, dispatcher, _group = left_running
    dispatcher.release()  # the worker goes away: nobody carries the stop out
    assert ledger.fail(request_id, "hung", actor="admin").request.state == RequestState.FAILING
    assert used(ledger, "team-a") == 1
    result = ledger.fail(request_id, "executor lost", actor="admin", force=True)
    assert result.request.state == RequestState.FAILED and result.released == {"gpu": 1}
    assert result.request.reason == "executor lost"
    assert used(ledger, "team-a") == 0 and ledger.check_invariants() == []
    assert audit(ledger, request_id) == [("fail", "stopping"), ("failed", "forced")]
    assert not [row for row in table(ledger, schema.outbox) if row["request_id"] == request_id]


def test_work_no_worker_took_up_ends_at_once(ledger: Quotagate, tmp_path: Path) -> None:
    process_target(ledger, tmp_path, "sleep 60")
    [reserved, other] = submit_and_admit(ledger, 2)
    result = ledger.complete(reserved, actor="admin")
    assert result.request.state == RequestState.COMPLETED and result.released == {"gpu": 1}
    result = ledger.fail(other, "not needed", actor="admin")
    assert result.request.state == RequestState.FAILED and result.released == {"gpu": 1}
    assert used(ledger, "team-a") == 0 and table(ledger, schema.outbox) == []
    assert audit(ledger, reserved) == [("completed", "released")]
    # A waiting request cannot be completed, as before; it changes nothing.
    ledger.submit("waits", "team-a", {"gpu": 1})  # not admitted: nothing admits here
    with pytest.raises(Conflict, match="waiting"):
        ledger.complete("waits", actor="admin")
    assert ledger.show("waits").state == RequestState.WAITING
    # Nothing was delivered: no worker ran, no run directory exists.
    assert run_directories(tmp_path) == []


def claimed_mid_delivery(gate: Quotagate) -> str:
    """One request reserved and claimed by a worker that has created nothing yet (and
    whose lease soon expires, as if it died): its id."""
    [request_id] = submit_and_admit(gate, 1)
    delivering = Dispatcher(gate, worker_name="w0", lease_ttl=0.3)
    assert delivering._hold_lease() and delivering.lease is not None
    [claim] = delivering.outbox.claim(delivering.lease, 10)
    assert claim.request_id == request_id
    return request_id


def test_reserved_work_a_worker_has_claimed_is_stopped_first(
    ledger: Quotagate, tmp_path: Path
) -> None:
    process_target(ledger, tmp_path, "sleep 60")
    request_id = claimed_mid_delivery(ledger)
    result = ledger.complete(request_id, actor="admin")
    assert result.request.state == RequestState.COMPLETING and result.released == {}
    assert used(ledger, "team-a") == 1 and ledger.check_invariants() == []
    # The delivering worker dies; another carries the stop out: nothing was created under
    # the request's name, so the stop is confirmed and the cost comes back once.
    stopper = Dispatcher(ledger, worker_name="w1", stop_poll=0.05)
    wait_for(lambda: stopper.run_once() is not None
             and ledger.show(request_id).state == RequestState.COMPLETED, "the stop")
    assert used(ledger, "team-a") == 0
    assert audit(ledger, request_id) == [("complete", "stopping"), ("completed", "released")]
    assert run_directories(tmp_path) == []  # never delivered after the admin's end
    stopper.release()


def test_the_stop_of_work_whose_target_does_not_exist_is_confirmed(ledger: Quotagate) -> None:
    """No target at all (docs/decisions/821): the stop cannot ask one, and need not."""
    request_id = claimed_mid_delivery(ledger)  # an attempt under way
    assert ledger.complete(request_id, actor="admin").request.state == RequestState.COMPLETING
    stopper = Dispatcher(ledger, worker_name="w1", stop_poll=0.05)
    wait_for(lambda: stopper.run_once() is not None
             and ledger.show(request_id).state == RequestState.COMPLETED, "the stop")
    assert used(ledger, "team-a") == 0
    [entry] = [row for row in table(ledger, schema.audit)
               if row["target"] == request_id and row["operation"] == "completed"]
    assert entry["reason"] == "never delivered: no such target"
    stopper.release()
