"""Stopping work at its max-runtime, where its tenant opts in, on every backend
(docs/decisions/714): the stop protocol of a cancel, ending ``timed_out``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.errors import InvalidInput
from quotagate.store import schema
from quotagate.store.overruns import stop_overruns
from support import overrun_workers
from support.racing import race
from support.receiver import Receiver, running_receiver
from support.waiting import wait_for
from support.worker_processes import start_worker, stop_all, table

REASON = "max_runtime 1s exceeded"


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_pool("pool-1", {"gpu": 16})
    # A budget, so what the stopped work held shows in its usage.
    gate.set_tenant("team-a", {"gpu": 16}, budget={"gpu": "10h/1d"}, stop_at_max_runtime=True)
    return gate


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as server:
        yield server


def _process_target(gate: Quotagate, tmp_path: Path) -> None:
    TargetStore(gate.engine).set(
        "local", "process",
        {"command": ["sh", "-c", "sleep 60"], "run_dir": str(tmp_path / "runs")}, default=True)


def _dispatcher(gate: Quotagate) -> Dispatcher:
    # overrun_interval 0: every pass looks, so a pass after the clock moved has looked.
    return Dispatcher(gate, worker_name="w1", stop_poll=0.05, overrun_interval=0)


def _used(gate: Quotagate) -> int:
    return int(gate.tenant("team-a")["quota"]["gpu"]["used"])


def _audit(gate: Quotagate, request_id: str, operation: str) -> list[dict[str, Any]]:
    return [row for row in table(gate, schema.audit)
            if row["target"] == request_id and row["operation"] == operation]


def _accrued(gate: Quotagate) -> int:
    usage = schema.budget_usage
    with gate.engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.coalesce(sa.func.sum(usage.c.amount), 0))
                                      .where(usage.c.tenant == "team-a")).scalar_one())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie no longer runs
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _run_directory(gate: Quotagate, tmp_path: Path, request_id: str) -> Path:
    [bound] = [row for row in table(gate, schema.binding) if row["request_id"] == request_id]
    return tmp_path / "runs" / bound["external_name"]


def _started(gate: Quotagate, tmp_path: Path, dispatcher: Dispatcher, request_id: str) -> int:
    """Deliver ``request_id`` to the process target; the process group it runs in."""
    dispatcher.run_once()
    assert gate.show(request_id).state == RequestState.DELIVERED
    run = _run_directory(gate, tmp_path, request_id)
    group = int(wait_for(lambda: (run / "pid").exists() and (run / "pid").read_text(),
                         "the command to start"))
    assert _alive(group)
    return group


def test_a_process_past_its_max_runtime_is_stopped_and_its_cost_returns_once(
    ledger: Quotagate, clock: ManualClock, tmp_path: Path
) -> None:
    _process_target(ledger, tmp_path)
    ledger.submit("job-1", "team-a", {"gpu": 3}, max_runtime=1)
    assert [placement.id for placement in ledger.admit()] == ["job-1"]
    dispatcher = _dispatcher(ledger)
    group = _started(ledger, tmp_path, dispatcher, "job-1")
    clock.advance(0.5)
    dispatcher.run_once()  # within its max-runtime: left alone
    assert ledger.show("job-1").state == RequestState.DELIVERED and _alive(group)

    clock.advance(1.5)  # 2 s since admission
    dispatcher.run_once()
    assert dispatcher.last_pass is not None and dispatcher.last_pass.overruns == 1
    assert "1 stop begun at the max-runtime" in dispatcher.last_pass.sentence()
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show("job-1").state == RequestState.TIMED_OUT, "the confirmed stop")
    ended = ledger.show("job-1")
    assert ended.reason == REASON
    assert not _alive(group)
    run = _run_directory(ledger, tmp_path, "job-1")
    assert (run / "exit_status").read_text() == str(-signal.SIGTERM)
    assert _used(ledger) == 0
    [begun] = _audit(ledger, "job-1", "timeout")
    assert (begun["outcome"], begun["reason"], begun["actor"]) == ("stopping", REASON, "worker:w1")
    [released] = _audit(ledger, "job-1", "timed_out")
    assert released["outcome"] == "released" and released["reason"] == REASON
    # The budget accrues what it actually held: 3 gpu x 2 s, admission to the confirmed stop.
    assert _accrued(ledger) == 6
    dispatcher.run_once()  # asked again: nothing more comes back
    assert len(_audit(ledger, "job-1", "timed_out")) == 1 and _used(ledger) == 0
    assert ledger.check_invariants() == []
    dispatcher.release()


def test_a_webhook_object_past_its_max_runtime_is_deleted_and_ends_timed_out(
    ledger: Quotagate, clock: ManualClock, receiver: Receiver
) -> None:
    TargetStore(ledger.engine).set("hook", "webhook", {"url": receiver.url}, default=True)
    ledger.submit("job-1", "team-a", {"gpu": 2}, max_runtime=1)
    ledger.admit()
    dispatcher = _dispatcher(ledger)
    dispatcher.run_once()
    assert ledger.show("job-1").state == RequestState.DELIVERED
    receiver.delete_answers = [202]  # "stopping": ask again
    clock.advance(1)
    dispatcher.run_once()
    stopping = ledger.show("job-1")
    # Charged until the target confirms; complete/fail are refused meanwhile.
    assert stopping.state == RequestState.TIMING_OUT and stopping.reason == REASON
    assert _used(ledger) == 2 and ledger.check_invariants() == []
    explained = ledger.explain("job-1")
    assert explained["state"] == "timing_out" and "past its max-runtime" in explained["reason"]
    with pytest.raises(Exception, match="timing_out"):
        ledger.complete("job-1")
    assert ledger.cancel("job-1").released == {}  # already stopping
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show("job-1").state == RequestState.TIMED_OUT, "the confirmed stop")
    deletes = receiver.calls_of("DELETE")
    assert len(deletes) == 2
    assert {call["headers"]["Quotagate-Ledger"] for call in deletes} == {ledger.ledger_id}
    assert ledger.show("job-1").reason == REASON
    assert _used(ledger) == 0 and len(_audit(ledger, "job-1", "timed_out")) == 1
    assert _accrued(ledger) == 2 * 1  # 2 gpu x 1 s
    assert ledger.check_invariants() == []
    dispatcher.release()


def test_reserved_work_never_delivered_is_stopped_too(
    ledger: Quotagate, clock: ManualClock, tmp_path: Path
) -> None:
    """Its max-runtime runs from admission: work stuck before delivery holds its cost too."""
    _process_target(ledger, tmp_path)
    ledger.submit("job-1", "team-a", {"gpu": 1}, max_runtime=1)
    ledger.admit()
    clock.advance(5)
    dispatcher = _dispatcher(ledger)
    dispatcher.run_once()  # begins the stop before it claims: the stop is all it delivers
    assert ledger.show("job-1").state == RequestState.TIMED_OUT
    assert not (tmp_path / "runs").exists() or not [
        path for path in (tmp_path / "runs").iterdir() if not path.name.startswith(".")]
    assert _used(ledger) == 0 and ledger.check_invariants() == []
    dispatcher.release()


def test_the_tenant_default_max_runtime_is_the_limit_when_none_is_declared(
    ledger: Quotagate, clock: ManualClock, receiver: Receiver
) -> None:
    TargetStore(ledger.engine).set("hook", "webhook", {"url": receiver.url}, default=True)
    ledger.set_tenant("team-a", {}, default_max_runtime="1m")
    ledger.submit("defaulted", "team-a", {"gpu": 1})
    ledger.admit()
    dispatcher = _dispatcher(ledger)
    dispatcher.run_once()
    clock.advance(59)
    dispatcher.run_once()
    assert ledger.show("defaulted").state == RequestState.DELIVERED
    clock.advance(1)
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show("defaulted").state == RequestState.TIMED_OUT, "the confirmed stop")
    assert ledger.show("defaulted").reason == "max_runtime 60s exceeded"
    dispatcher.release()


def test_a_tenant_that_does_not_opt_in_keeps_its_overruns_running(
    gate: Quotagate, clock: ManualClock, tmp_path: Path
) -> None:
    gate.set_pool("pool-1", {"gpu": 16})
    gate.set_tenant("team-a", {"gpu": 16}, budget={"gpu": "10h/1d"})
    assert gate.tenant("team-a")["stop_at_max_runtime"] is False
    _process_target(gate, tmp_path)
    gate.submit("job-1", "team-a", {"gpu": 1}, max_runtime=1)
    gate.submit("no-limit", "team-a", {"gpu": 1})
    gate.admit(2)
    dispatcher = _dispatcher(gate)
    group = _started(gate, tmp_path, dispatcher, "job-1")
    clock.advance(7200)
    dispatcher.run_once()  # looked: overruns keep running and accrue (docs/decisions/711)
    assert dispatcher.last_pass is not None and dispatcher.last_pass.overruns == 0
    assert gate.show("job-1").state == RequestState.DELIVERED and _alive(group)
    # Opting in later stops what already overran; work with no max-runtime is never stopped.
    gate.set_tenant("team-a", {}, stop_at_max_runtime=True)
    wait_for(lambda: dispatcher.run_once() is not None
             and gate.show("job-1").state == RequestState.TIMED_OUT, "the confirmed stop")
    assert gate.show("no-limit").state == RequestState.DELIVERED
    assert _accrued(gate) == 7200  # job-1's 1 gpu x 7200 s
    # Opting out again leaves the rest running.
    gate.set_tenant("team-a", {}, stop_at_max_runtime=False)
    assert gate.tenant("team-a")["stop_at_max_runtime"] is False
    assert gate.check_invariants() == []
    dispatcher.release()


def test_several_workers_racing_begin_each_stop_once(ledger: Quotagate, db_url: str) -> None:
    ledger.submit("within", "team-a", {"gpu": 1}, max_runtime=3600, priority=1)
    for index in range(24):
        ledger.submit(f"job-{index:02d}", "team-a", {"gpu": 1}, max_runtime=1 + index % 3)
    assert len(ledger.admit(25)) == 16  # the quota holds 16: "within" and 15 more
    now = ledger.clock.now() + 10
    answers = race(overrun_workers.stop_overruns_at, db_url, now, "racer", processes=4)
    moved = [request_id for answer in answers for request_id in answer]
    running = {row["id"] for row in table(ledger, schema.request)
               if row["id"] != "within" and row["admitted"] is not None}
    assert sorted(moved) == sorted(running)  # every overrun once, by exactly one of them
    for request_id in running:
        assert ledger.show(request_id).state == RequestState.TIMING_OUT
        assert len(_audit(ledger, request_id, "timeout")) == 1
        stops = [row for row in table(ledger, schema.outbox) if row["request_id"] == request_id]
        assert [row["stopping"] for row in stops] == [True]
    assert ledger.show("within").state == RequestState.RESERVED
    assert _used(ledger) == 16 and ledger.check_invariants() == []


def test_tenant_setting_is_validated_and_audited(ledger: Quotagate) -> None:
    assert ledger.tenant("team-a")["stop_at_max_runtime"] is True
    with pytest.raises(Exception) as refused:
        ledger.set_tenant("team-a", {}, stop_at_max_runtime="yes")  # type: ignore[arg-type]
    assert getattr(refused.value, "code", None) == "invalid_stop_at_max_runtime"
    assert ledger.tenant("team-a")["stop_at_max_runtime"] is True
    changes = [row["reason"] for row in table(ledger, schema.audit)
               if row["operation"] == "tenant.set"]
    assert any("stop_at_max_runtime=on" in (reason or "") for reason in changes)


def test_a_grace_lets_work_run_past_its_max_runtime_before_its_stop_begins(
    ledger: Quotagate, clock: ManualClock, receiver: Receiver
) -> None:
    """The tenant's max_runtime_grace (docs/decisions/715): the stop begins at admission +
    max-runtime + grace; the budget accrues the whole time held, grace included."""
    TargetStore(ledger.engine).set("hook", "webhook", {"url": receiver.url}, default=True)
    ledger.set_tenant("team-a", {}, max_runtime_grace=30)
    assert ledger.tenant("team-a")["max_runtime_grace"] == 30
    ledger.submit("job-1", "team-a", {"gpu": 2}, max_runtime=10)
    ledger.admit()
    dispatcher = _dispatcher(ledger)
    dispatcher.run_once()
    clock.advance(39)  # past its max-runtime, within the grace: left alone
    dispatcher.run_once()
    assert dispatcher.last_pass is not None and dispatcher.last_pass.overruns == 0
    assert ledger.show("job-1").state == RequestState.DELIVERED
    clock.advance(1)  # 10 s + 30 s since admission
    dispatcher.run_once()
    assert dispatcher.last_pass is not None and dispatcher.last_pass.overruns == 1
    reason = "max_runtime 10s exceeded (grace 30s)"
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show("job-1").state == RequestState.TIMED_OUT, "the confirmed stop")
    assert ledger.show("job-1").reason == reason
    [begun] = _audit(ledger, "job-1", "timeout")
    assert begun["reason"] == reason
    assert _accrued(ledger) == 2 * 40  # 2 gpu x 40 s held: the grace is charged
    assert _used(ledger) == 0 and ledger.check_invariants() == []
    dispatcher.release()


def test_a_changed_grace_applies_at_the_next_look(
    ledger: Quotagate, clock: ManualClock
) -> None:
    ledger.set_tenant("team-a", {}, max_runtime_grace="1h")
    ledger.submit("job-1", "team-a", {"gpu": 1}, max_runtime=60)
    ledger.admit()
    now = ledger.clock.now()
    assert stop_overruns(ledger.engine, now + 120, actor="worker:w1") == []
    ledger.set_tenant("team-a", {}, max_runtime_grace=0)  # 0: none, as before 715
    assert stop_overruns(ledger.engine, now + 120, actor="worker:w1") == ["job-1"]
    assert ledger.show("job-1").reason == "max_runtime 60s exceeded"


@pytest.mark.parametrize("value", [-1, "-1", 1.5, "1.5", True, "soon", 7 * 86400 + 1, "8d",
                                   10**12])
def test_a_bad_grace_is_refused_and_changes_nothing(ledger: Quotagate, value: object) -> None:
    ledger.set_tenant("team-a", {}, max_runtime_grace=300)
    with pytest.raises(InvalidInput) as refused:
        ledger.set_tenant("team-a", {"gpu": 1}, max_runtime_grace=value)
    assert refused.value.code == "invalid_max_runtime_grace"
    assert "max_runtime_grace must be" in str(refused.value)
    described = ledger.tenant("team-a")
    assert described["max_runtime_grace"] == 300 and described["quota"]["gpu"]["cap"] == 16
    changes = [row["reason"] for row in table(ledger, schema.audit)
               if row["operation"] == "tenant.set"]
    assert changes[-1] == "max_runtime_grace=300s"


def test_two_workers_passing_in_turn_stop_and_release_each_overrun_once(
    ledger: Quotagate, clock: ManualClock, receiver: Receiver
) -> None:
    TargetStore(ledger.engine).set("hook", "webhook", {"url": receiver.url}, default=True)
    ids = [f"job-{index}" for index in range(8)]
    for request_id in ids:
        ledger.submit(request_id, "team-a", {"gpu": 1}, max_runtime=1)
    ledger.admit(8)
    workers = [Dispatcher(ledger, worker_name=name, stop_poll=0.05, overrun_interval=0)
               for name in ("w1", "w2")]
    workers[0].run_once()
    clock.advance(2)

    def all_ended() -> bool:
        for worker in workers:
            worker.run_once()
        return all(ledger.show(request_id).state == RequestState.TIMED_OUT for request_id in ids)

    wait_for(all_ended, "every stop confirmed")
    for request_id in ids:
        assert len(_audit(ledger, request_id, "timeout")) == 1
        assert len(_audit(ledger, request_id, "timed_out")) == 1
    # Both workers count into the app's counters: 8 stops begun in all, none twice.
    assert ledger.delivery_counters.snapshot()["overruns"] == 8
    assert _used(ledger) == 0 and _accrued(ledger) == 8 * 2
    assert ledger.check_invariants() == []
    for worker in workers:
        worker.release()


def test_two_worker_processes_stop_each_overrun_once(db_url: str, tmp_path: Path) -> None:
    """Real ``quotagate worker`` processes on the real clock: 1 s max-runtimes pass.

    A worker that starts slowly may find a request past its limit before delivering
    it: its stop is then confirmed at once ("never delivered"), which is also right."""
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 8})
        gate.set_tenant("team-a", {"gpu": 8}, stop_at_max_runtime=True)
        _process_target(gate, tmp_path)
        ids = [f"job-{index}" for index in range(6)]
        for request_id in ids:
            gate.submit(request_id, "team-a", {"gpu": 1}, max_runtime=1)
        assert gate.admit_until_idle() == 6
        workers = [start_worker(db_url, name) for name in ("w1", "w2")]
        try:
            wait_for(lambda: all(gate.show(request_id).state == RequestState.TIMED_OUT
                                 for request_id in ids), "every stop confirmed", timeout=120)
        finally:
            stop_all(workers)
        for request_id in ids:
            assert len(_audit(gate, request_id, "timeout")) == 1
            assert len(_audit(gate, request_id, "timed_out")) == 1
        assert _used(gate) == 0 and gate.check_invariants() == []
