"""``Dispatcher.run`` reads outcomes on a thread of its own (docs/decisions/260).

On PostgreSQL and MariaDB the outcome reads and their ends run beside the delivery
passes: a slow outcome read no longer holds up the next claim, and the ends stay
fenced by the lease the passes hold, so a generation that was taken over releases
nothing. SQLite keeps them in the passes (one writer): the first test is not run there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.base import ExternalObject, Outcome
from quotagate.store import schema
from support.waiting import wait_for

HELD = 60.0  # how long a held outcome read waits for the test at most


class _HeldReads:
    """Creates at once; its outcome reads wait for ``go`` and then report every object ended."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.go = threading.Event()
        self.created: list[str] = []

    def create_if_absent(self, spec: Any) -> ExternalObject:
        self.created.append(spec.request_id)
        return ExternalObject(spec.external_name, "uid", spec.request_id, created_now=True)

    def outcomes(self, objects: Any) -> dict[str, Outcome]:
        self.reading.set()
        self.go.wait(HELD)
        return {obtained.request_id: Outcome(completed=True) for obtained in objects}


@pytest.fixture
def ledger(gate: Quotagate, tmp_path: Path) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 10})
    gate.set_pool("pool-1", {"gpu": 10})
    # A default target to resolve; the tests hand every call to their own target instead.
    TargetStore(gate.engine, clock=gate.clock).set(
        "local", "process", {"command": ["true"], "run_dir": str(tmp_path / "runs")},
        default=True)
    return gate


def _with_target(monkeypatch: pytest.MonkeyPatch, dispatcher: Dispatcher, target: Any) -> None:
    """Every target the dispatcher resolves, for its passes and its outcome thread, is ``target``."""
    config, _process = dispatcher.built.get(None)
    for built in (dispatcher.built, dispatcher.observed):
        monkeypatch.setattr(built, "get", lambda _name: (config, target))


@pytest.fixture
def running() -> Iterator[list[tuple[Dispatcher, threading.Event, threading.Thread]]]:
    """Dispatchers started with :func:`_start`; stopped (and their held reads let go) at the end."""
    started: list[tuple[Dispatcher, threading.Event, threading.Thread]] = []
    yield started
    for _dispatcher, stop, _thread in started:
        stop.set()
    for _dispatcher, _stop, thread in started:
        thread.join(HELD + 30)


def _start(running: list[tuple[Dispatcher, threading.Event, threading.Thread]],
           dispatcher: Dispatcher) -> threading.Event:
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,), name="test-dispatcher")
    running.append((dispatcher, stop, thread))
    thread.start()
    return stop


def _state(gate: Quotagate, request_id: str) -> RequestState:
    return gate.show(request_id).state


def _released(gate: Quotagate) -> int:
    with gate.engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(schema.audit)
            .where(schema.audit.c.outcome == "released")).scalar_one())


def test_a_slow_outcome_read_does_not_hold_up_the_next_delivery(
    ledger: Quotagate, backend: str, monkeypatch: pytest.MonkeyPatch,
    running: list[tuple[Dispatcher, threading.Event, threading.Thread]],
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite reads outcomes in the passes (one writer, docs/decisions/260)")
    dispatcher = Dispatcher(ledger, worker_name="w1", poll_interval=0.05)
    target = _HeldReads()
    _with_target(monkeypatch, dispatcher, target)
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    stop = _start(running, dispatcher)
    try:
        wait_for(target.reading.is_set, "the outcome read of job-1")
        # The read is held; work admitted now is claimed and delivered all the same.
        ledger.submit("job-2", "team-a", {"gpu": 1})
        ledger.admit()
        wait_for(lambda: _state(ledger, "job-2") == RequestState.DELIVERED,
                 "job-2 delivered while job-1's outcome read is held")
        assert not target.go.is_set() and _state(ledger, "job-1") == RequestState.DELIVERED
    finally:
        target.go.set()
    wait_for(lambda: {_state(ledger, i) for i in ("job-1", "job-2")} == {RequestState.COMPLETED},
             "both ended")
    stop.set()
    assert target.created == ["job-1", "job-2"]
    assert _released(ledger) == 2 and ledger.usage()["tenants"][0]["used"] == 0
    assert ledger.check_invariants() == []


def test_ends_read_under_a_lease_that_was_taken_over_release_nothing(
    ledger: Quotagate, monkeypatch: pytest.MonkeyPatch,
    running: list[tuple[Dispatcher, threading.Event, threading.Thread]],
) -> None:
    """Generational fencing holds for the outcome thread: its ends go through the lease
    fence, so once another process of the same name took the lease over, the old
    generation's reported ends change nothing, and the new one ends the work once."""
    old = Dispatcher(ledger, worker_name="w1", lease_ttl=30, poll_interval=0.05)
    target = _HeldReads()
    _with_target(monkeypatch, old, target)
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    stale_before = ledger.delivery_counters.snapshot()["stale_writes"]
    _start(running, old)
    try:
        wait_for(target.reading.is_set, "the outcome read of job-1")
        assert old.lease is not None and old.lease.generation == 1
        # The old process stalls past its lease; a new process of the same name takes over.
        with ledger.engine.begin() as connection:
            connection.execute(schema.lease.update().where(schema.lease.c.name == "worker/w1")
                               .values(expires_at=0.0))
        new = Dispatcher(ledger, worker_name="w1", lease_ttl=30)
        wait_for(new._hold_lease, "the takeover")
        assert new.lease is not None and new.lease.generation == 2
    finally:
        target.go.set()  # the old generation's read reports job-1 ended
    wait_for(lambda: ledger.delivery_counters.snapshot()["stale_writes"] > stale_before,
             "the old generation's ends refused")
    wait_for(lambda: old.lease is None, "the old generation to drop its lease")
    assert _state(ledger, "job-1") == RequestState.DELIVERED
    assert _released(ledger) == 0 and ledger.usage()["tenants"][0]["used"] == 1

    _with_target(monkeypatch, new, target)
    wait_for(lambda: new.run_once() and _state(ledger, "job-1") == RequestState.COMPLETED,
             "the new generation to end job-1")
    assert _released(ledger) == 1 and ledger.usage()["tenants"][0]["used"] == 0
    assert ledger.check_invariants() == []
    new.release()
