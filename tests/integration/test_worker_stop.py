"""A SIGTERMed ``quotagate worker`` exits in bounded time in each phase (decisions/905, 906).

Real worker processes. While it waits for a predecessor's lease it stops cleanly at once;
blocked in a database call on a row lock (PostgreSQL waits for ever, MariaDB for
innodb_lock_wait_timeout), it exits ``GRACE_EXPIRED_EXIT`` after ``--exit-grace``, its lease
left in place to expire, and a restarted worker takes over.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.cli.stop_signals import GRACE_EXPIRED_EXIT
from quotagate.store import schema
from quotagate.store.lease import LeaseStore
from support.waiting import LOCK_POLL_SECONDS, blocked_by, session_id, wait_for
from support.worker_processes import finish, start_worker, wait_for_generation

SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mysql", marks=pytest.mark.mysql)]
LEASE = "worker/w1"


@pytest.fixture
def gate(db_url: str) -> Iterator[Quotagate]:
    with Quotagate.connect(db_url) as opened:
        yield opened


def wait_for_line(worker: object, text: str) -> None:
    """Read the worker's stderr until a line holds ``text``."""
    stream = worker.stderr  # type: ignore[attr-defined]
    seen: list[str] = []
    while True:
        line = stream.readline().decode(errors="replace")
        if not line:
            raise AssertionError(f"worker exited without saying {text!r}: {''.join(seen)}")
        seen.append(line)
        if text in line:
            return


def test_a_worker_waiting_for_its_predecessors_lease_stops_on_sigterm(
    gate: Quotagate, db_url: str
) -> None:
    leases = LeaseStore(gate.engine)
    predecessor = leases.acquire(LEASE, "w1", 300)  # a dead predecessor's, far from expiry
    assert predecessor is not None
    worker = start_worker(db_url, "w1")
    wait_for_line(worker, "waiting for it to expire")
    worker.terminate()
    assert finish(worker, allowed=(0,)) == 0
    still = leases.get(LEASE)  # untouched: neither taken nor released
    assert (still.owner, still.generation) == ("w1", predecessor.generation)


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_worker_blocked_on_a_row_lock_exits_within_its_grace_and_leaves_its_lease(
    gate: Quotagate, db_url: str
) -> None:
    worker = start_worker(db_url, "w1", "--exit-grace", "1")
    generation = wait_for_generation(gate, "w1", above=0)
    with gate.engine.connect() as holder:
        # Another transaction holds the lease row: the worker's next renewal waits on it.
        holder.execute(sa.select(schema.lease).where(schema.lease.c.name == LEASE)
                       .with_for_update())
        holder_id = session_id(holder)
        wait_for(lambda: blocked_by(gate.engine, holder_id) > 0 or worker.poll() is not None,
                 "the worker's renewal to wait for the lease row", timeout=60,
                 interval=LOCK_POLL_SECONDS)
        assert worker.poll() is None, "the worker exited before blocking"
        worker.terminate()
        assert finish(worker, allowed=(GRACE_EXPIRED_EXIT,)) == GRACE_EXPIRED_EXIT
        holder.rollback()
    left = LeaseStore(gate.engine).get(LEASE)  # not released: it expires, as after a crash
    assert (left.owner, left.generation) == ("w1", generation)
    successor = start_worker(db_url, "w1")  # takes the lease over once it expired
    wait_for_generation(gate, "w1", above=generation)
    successor.terminate()
    assert finish(successor, allowed=(0,)) == 0
