"""The confirmed stop of work a preemption decision counts as coming back waits for the
decision lock (docs/decisions/709, 714, 716), on PostgreSQL and MariaDB.

One connection of the test holds the lock (the ledger identity row, as a decision or an
admission judging held room does); another process confirms the stop. The holder then
sees, through the server's own lock tables (``pg_blocking_pids``, InnoDB's lock waits),
that the confirmation is waiting for it, and nothing has come back; once it lets go the
stop ends and the cost returns once. A completion, which no decision counts as coming
back, does not wait.

SQLite is not here because it is true there by construction: every writing transaction
begins IMMEDIATE (docs/decisions/005) and holds the one write lock of the file until it
ends, so a confirmation never runs inside a decision's transaction, whatever it locks.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest

from quotagate import Quotagate
from quotagate.store.overruns import stop_overruns
from quotagate.store.release import lock_decisions
from support import cohort_workers, workers
from support.stops import state, used
from support.waiting import LOCK_POLL_SECONDS, blocked_by, session_id, wait_for

SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mysql", marks=pytest.mark.mysql)]


def _timing_out(gate: Quotagate) -> str:
    gate.set_tenant("team-a", {}, stop_at_max_runtime=True)
    gate.submit("job", "team-a", {"gpu": 2}, max_runtime=1)
    gate.admit()
    assert stop_overruns(gate.engine, gate.clock.now() + 5, actor="worker:w1") == ["job"]
    return "timing_out"


def _cancelling(gate: Quotagate) -> str:
    gate.submit("job", "team-a", {"gpu": 2})
    gate.admit()
    gate.cancel("job")
    return "cancelling"


def _preempting(gate: Quotagate) -> str:
    gate.set_tenant("team-a", {}, within_tenant="lower-priority")
    gate.submit("job", "team-a", {"gpu": 2}, priority=0)
    gate.submit("filler", "team-a", {"gpu": 2}, priority=3)
    gate.admit(2)
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    assert gate.admit() == []  # "job", the lowest priority, is stopped for it
    return "preempting"


STOPPING: dict[str, Callable[[Quotagate], str]] = {
    "timing_out": _timing_out, "cancelling": _cancelling, "preempting": _preempting}


@pytest.fixture
def pool(gate: Quotagate) -> Quotagate:
    gate.set_pool("pool-1", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 4})
    # The row the lock is taken on; a ledger makes it before its first decision.
    assert gate.ledger_id
    return gate


def _start(target: Callable[..., None], url: str, request_id: str) -> tuple[Any, Any]:
    """``target(url, request_id, barrier, results)`` in a process of its own, started."""
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    # The test and the child: it returns once the child is connected and about to act
    # (and the barrier lived until the child unpickled it).
    barrier = context.Barrier(2)
    child = context.Process(target=target, args=(url, request_id, barrier, results),
                            daemon=True)
    child.start()
    barrier.wait(timeout=60)
    return child, results


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
@pytest.mark.parametrize("stopping", sorted(STOPPING))
def test_the_confirmed_stop_waits_for_the_decision_lock(
    pool: Quotagate, db_url: str, stopping: str
) -> None:
    gate = pool
    assert STOPPING[stopping](gate) == stopping and state(gate, "job") == stopping
    before = used(gate, "team-a")
    with gate.engine.connect() as holder:
        transaction = holder.begin()
        lock_decisions(holder)
        holder_id = session_id(holder)
        child, results = _start(cohort_workers.confirm_stop, db_url, "job")
        try:
            # Waiting on the condition: blocked behind the holder, or (wrongly) done.
            wait_for(lambda: blocked_by(gate.engine, holder_id) or not child.is_alive()
                     or not results.empty(), "the confirmation to wait or end",
                     timeout=60, interval=LOCK_POLL_SECONDS)
            assert child.is_alive() and results.empty(), "the confirmation did not wait"
            assert blocked_by(gate.engine, holder_id) == 1
            # Nothing came back while it waits: the decision would see it still stopping.
            assert state(gate, "job") == stopping and used(gate, "team-a") == before
        finally:
            transaction.rollback()
    assert results.get(timeout=60) == {"gpu": 2}
    child.join(timeout=60)
    assert child.exitcode == 0
    ended = {"timing_out": "timed_out", "cancelling": "cancelled", "preempting": "preempted"}
    assert state(gate, "job") == ended[stopping]
    assert used(gate, "team-a") == before - 2 and gate.check_invariants() == []


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_completion_does_not_wait_for_the_decision_lock(pool: Quotagate, db_url: str) -> None:
    """The probe tells the two apart: work no decision counts as coming back ends at once."""
    gate = pool
    gate.submit("job", "team-a", {"gpu": 2})
    gate.admit()
    with gate.engine.connect() as holder:
        transaction = holder.begin()
        lock_decisions(holder)
        holder_id = session_id(holder)
        child, results = _start(workers.release_one, db_url, "job")
        try:
            wait_for(lambda: blocked_by(gate.engine, holder_id) or not results.empty(),
                     "the completion to wait or end", timeout=60, interval=LOCK_POLL_SECONDS)
            assert not blocked_by(gate.engine, holder_id)
            assert results.get(timeout=60) == {"gpu": 2}
        finally:
            transaction.rollback()
    child.join(timeout=60)
    assert child.exitcode == 0 and state(gate, "job") == "completed"
