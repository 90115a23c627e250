"""Generational leases on SQLite, PostgreSQL and MariaDB, with real processes.

The takeover scenario (docs/invariants.md, 6): worker-a holds generation 1 and is SIGKILLed; after
expiry a new worker *of the same name* takes over with generation 2; the owner
name alone no longer tells them apart; the old generation's late write
affects nothing and is reported as stale.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate import StaleGeneration
from quotagate.domain.lease import Lease
from quotagate.store import schema
from quotagate.store.dialect import database_now, run_transaction
from quotagate.store.engine import create_engine
from quotagate.store.lease import LeaseStore
from support.waiting import wait_for

# Holds the lease and keeps renewing it, as a live worker does, until killed.
# A 5 s TTL: a holder stalled for a second on a loaded machine still holds it.
HOLDER = """
import sys, time
from quotagate.store.engine import create_engine
from quotagate.store.lease import LeaseStore
store = LeaseStore(create_engine(sys.argv[1]))
lease = None
while lease is None:
    lease = store.acquire("takeover", "worker-a", 5.0)
print(lease.generation, flush=True)
while True:
    lease = store.renew(lease, 5.0)
    time.sleep(0.05)
"""

# Waits for the start file, then tries once to acquire; prints the generation or "none".
CONTENDER = """
import os, sys, time
from quotagate.store.engine import create_engine
from quotagate.store.lease import LeaseStore
store = LeaseStore(create_engine(sys.argv[1]))
store.engine.connect().close()
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.005)
lease = store.acquire("contested", sys.argv[3], 30.0)
print("none" if lease is None else lease.generation, flush=True)
"""


@pytest.fixture
def leases(db_url: str) -> LeaseStore:
    store = LeaseStore(create_engine(db_url))
    yield store  # type: ignore[misc]
    store.engine.dispose()


def lease_row(store: LeaseStore, name: str) -> tuple[str | None, int, float]:
    with store.engine.connect() as connection:
        row = connection.execute(
            sa.select(schema.lease.c.owner, schema.lease.c.generation, schema.lease.c.expires_at)
            .where(schema.lease.c.name == name)
        ).one()
    return row.owner, int(row.generation), float(row.expires_at)


def test_a_takeover_by_the_same_name_fences_the_killed_generation(
    leases: LeaseStore, db_url: str
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, db_url], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "1"  # leaseAcquire holder=worker-a generation=1
        # While the holder lives (and renews), nobody takes over, not even its own name.
        assert leases.acquire("takeover", "worker-a", 1.0) is None
        holder.send_signal(signal.SIGKILL)  # leaseHolderKilled signal=SIGKILL
        holder.wait(timeout=10)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert holder.returncode == -signal.SIGKILL

    # After expiry (by the database's clock) the restarted worker-a takes over.
    takeover = wait_for(lambda: leases.acquire("takeover", "worker-a", 30.0), "the takeover",
                        timeout=60.0)
    assert (takeover.owner, takeover.generation) == ("worker-a", 2)  # affected=1, generation=2

    with leases.engine.connect() as connection:
        owner_only = connection.execute(
            sa.select(sa.func.count()).select_from(schema.lease).where(
                schema.lease.c.name == "takeover", schema.lease.c.owner == "worker-a"
            )
        ).scalar_one()
    assert owner_only == 1  # leaseOwnerOnlyMatches: the name cannot tell old from new

    before = lease_row(leases, "takeover")
    stale_before = leases.counters.snapshot()["stale_writes"]
    old = Lease("takeover", "worker-a", 1, 0.0)
    with pytest.raises(StaleGeneration) as error:
        leases.renew(old, 60.0)  # leaseStaleWrite generation=1
    assert error.value.fields["generation"] == 1
    with pytest.raises(StaleGeneration):
        run_transaction(leases.engine, lambda connection: leases.fence(connection, old))
    assert leases.release(old) is False
    assert leases.counters.snapshot()["stale_writes"] == stale_before + 3
    # The seed's raw late write, conditioned on the old generation: 0 rows.
    with leases.engine.begin() as connection:
        affected = connection.execute(
            schema.lease.update()
            .where(schema.lease.c.name == "takeover", schema.lease.c.owner == "worker-a",
                   schema.lease.c.generation == 1)
            .values(expires_at=schema.lease.c.expires_at + 60)
        ).rowcount
    assert affected == 0
    assert lease_row(leases, "takeover") == before  # leaseFinal owner=worker-a generation=2


def test_acquire_creates_the_row_and_refuses_while_held(leases: LeaseStore) -> None:
    first = leases.acquire("solo", "worker-a", 30.0)
    assert first is not None and first.generation == 1
    assert leases.acquire("solo", "worker-b", 30.0) is None
    assert leases.acquire("solo", "worker-a", 30.0) is None  # no silent re-entry
    assert lease_row(leases, "solo")[:2] == ("worker-a", 1)


def test_renew_extends_and_release_frees_without_resetting_the_generation(
    leases: LeaseStore,
) -> None:
    first = leases.acquire("solo", "worker-a", 30.0)
    assert first is not None
    renewed = leases.renew(first, 120.0)
    assert renewed.generation == 1 and renewed.expires_at > first.expires_at
    assert leases.release(renewed) is True
    assert lease_row(leases, "solo")[:2] == (None, 1)
    second = leases.acquire("solo", "worker-b", 30.0)
    assert second is not None and second.generation == 2


def _database_now(leases: LeaseStore) -> float:
    with leases.engine.connect() as connection:
        return float(connection.execute(sa.select(database_now(connection))).scalar_one())


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
def test_expiry_is_judged_by_the_database_clock(
    leases: LeaseStore, monkeypatch: pytest.MonkeyPatch, skew: float
) -> None:
    """A worker whose clock is an hour off agrees with the database on who holds a lease.

    The worker's clocks (``time.time`` and the application clock) are skewed; the
    database's is not. A lease store that judged expiry by the worker would write
    expiries an hour off and hand the lease over an hour early or late.
    """
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew)
    assert abs(time.time() - _database_now(leases) - skew) < 5  # the skew is real
    first = leases.acquire("short", "worker-a", 2.0)
    assert first is not None
    # expires_at came from the database (its now + ttl), not from this process.
    assert abs(first.expires_at - (_database_now(leases) + 2.0)) < 1.5
    # Held while the database says so, however far ahead this worker's clock runs.
    assert leases.acquire("short", "worker-b", 30.0) is None
    renewed = leases.renew(first, 2.0)
    assert abs(renewed.expires_at - (_database_now(leases) + 2.0)) < 1.5
    # Free once the database says so, however far behind this worker's clock runs.
    taken = wait_for(lambda: leases.acquire("short", "worker-b", 30.0), "expiry", timeout=30.0)
    assert taken.generation == 2
    assert _database_now(leases) >= renewed.expires_at
    with pytest.raises(StaleGeneration):
        leases.renew(renewed, 30.0)


def test_concurrent_processes_racing_for_a_free_lease_yield_one_holder(
    leases: LeaseStore, db_url: str, tmp_path: Path
) -> None:
    start = tmp_path / "go"
    contenders = [
        subprocess.Popen([sys.executable, "-c", CONTENDER, db_url, str(start), f"worker-{n}"],
                         stdout=subprocess.PIPE, text=True)
        for n in range(4)
    ]
    for contender in contenders:  # all connected and waiting: then the race starts
        assert contender.stdout is not None
        assert contender.stdout.readline().strip() == "ready"
    start.touch()
    answers = []
    for contender in contenders:
        out, _ = contender.communicate(timeout=60)
        assert contender.returncode == 0
        answers.append(out.strip())
    assert sorted(answers) == ["1", "none", "none", "none"]
    owner, generation, _ = lease_row(leases, "contested")
    assert generation == 1 and owner is not None
    os.remove(start)
