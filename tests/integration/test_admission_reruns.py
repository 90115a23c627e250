"""What production must record: admission reruns by cause and lock-wait time, from real lock conflicts.

Row locks that make a transaction wait exist on the servers, so most of these run
on PostgreSQL and MariaDB/MySQL; SQLite takes its one write lock at BEGIN instead,
and its wait there is what the lock-wait histogram times (the last test).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from quotagate import Quotagate
from quotagate.domain.placement import Placement
from quotagate.observability.metrics import Metrics
from quotagate.store import admission_stats, schema
from quotagate.store.dialect import batches_writes, is_retryable, retry_cause, run_transaction
from support.waiting import lock_waiters, wait_for

SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mysql", marks=pytest.mark.mysql)]
HELD_SECONDS = 0.4
# InnoDB answers information_schema.innodb_trx from a cache it refreshes only when
# the cache has not been read for 0.1 s: polling faster would see it stale forever.
LOCK_POLL_SECONDS = 0.2


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    admission_stats.reset()
    yield
    admission_stats.reset()


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_charge_that_waited_on_a_lock_and_then_missed_is_a_stale_snapshot_rerun(
    gate: Quotagate,
) -> None:
    gate.set_pool("main", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 2})
    gate.submit("job-1", "team-a", {"gpu": 1})
    admitted: list[object] = []
    with gate.engine.connect() as holder:
        transaction = holder.begin()
        # Another writer takes team-a's quota row and fills it, not committed yet.
        holder.execute(schema.tenant_quota.update()
                       .where(schema.tenant_quota.c.tenant == "team-a")
                       .values(used=schema.tenant_quota.c.cap))
        admitter = threading.Thread(target=lambda: admitted.extend(gate.admit(1)))
        admitter.start()
        wait_for(lambda: lock_waiters(gate.engine) > 0, "admission to wait for the quota row lock",
                 interval=LOCK_POLL_SECONDS)
        blocked_at = time.perf_counter()
        time.sleep(HELD_SECONDS)  # hold the lock a known time: the wait must cover it
        transaction.commit()
        held = time.perf_counter() - blocked_at
        admitter.join(30)
    assert not admitter.is_alive()
    # Its snapshot said room; the charge, once it got the row, found none: rerun, nothing fits.
    assert admitted == []
    assert gate.show("job-1").state.value == "waiting"
    stats = admission_stats.snapshot()
    assert stats.reruns == {"stale_snapshot": 1, "lock_timeout": 0, "deadlock": 0,
                            "claims_too_narrow": 0}
    assert stats.lock_wait_sum >= held
    value = Metrics(gate.engine).registry.get_sample_value
    assert value("quotagate_admission_reruns_total", {"cause": "stale_snapshot"}) == 1
    assert value("quotagate_admission_lock_wait_seconds_sum") >= held
    assert value("quotagate_admission_lock_wait_seconds_count") == stats.lock_wait_count


def _set_lock_timeout(connection: sa.Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("SET LOCAL lock_timeout = '100ms'")
    else:
        connection.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_lock_timeout_is_rerun_and_reported_as_lock_timeout(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 2})
    quota = schema.tenant_quota
    bump = quota.update().where(quota.c.tenant == "team-a").values(cap=quota.c.cap + 1)
    causes: list[str] = []
    holder = gate.engine.connect()
    transaction = holder.begin()
    holder.execute(bump)

    def on_retry(error: DBAPIError) -> None:
        assert is_retryable(error)
        causes.append(retry_cause(error))
        if transaction.is_active:
            transaction.commit()  # the lock goes away: the rerun gets through

    def work(connection: sa.Connection) -> None:
        _set_lock_timeout(connection)
        connection.execute(bump)

    try:
        run_transaction(gate.engine, work, on_retry=on_retry)
    finally:
        holder.close()
    assert causes == ["lock_timeout"]
    assert gate.config.get_tenant("team-a")["quota"]["gpu"]["cap"] == 4


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_deadlock_is_told_apart_from_a_lock_timeout(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 2})
    quota = schema.tenant_quota

    def bump(connection: sa.Connection, tenant: str) -> None:
        connection.execute(quota.update().where(quota.c.tenant == tenant)
                           .values(cap=quota.c.cap + 1))

    first, second = gate.engine.connect(), gate.engine.connect()
    errors: list[DBAPIError] = []
    try:
        first_transaction, second_transaction = first.begin(), second.begin()
        bump(first, "team-a")
        bump(second, "team-b")

        def cross(connection: sa.Connection, tenant: str) -> None:
            try:
                bump(connection, tenant)
            except DBAPIError as error:
                errors.append(error)

        crossing = threading.Thread(target=cross, args=(first, "team-b"))
        crossing.start()
        wait_for(lambda: lock_waiters(gate.engine) > 0, "the first transaction to wait")
        cross(second, "team-a")  # each now waits for the other: the server picks a victim
        second_transaction.rollback()
        crossing.join(30)
        first_transaction.rollback()
    finally:
        first.close()
        second.close()
    assert len(errors) == 1
    assert is_retryable(errors[0])
    assert retry_cause(errors[0]) == "deadlock"


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_admission_locks_members_rows_in_key_order_so_another_writer_in_that_order_never_deadlocks(
    gate: Quotagate,
) -> None:
    # team-b's quota row is written first, so a charge that locked in the table's
    # physical order would take team-b's row before waiting for team-a's.
    gate.set_pool("main", {"gpu": 8})
    gate.set_cohort("research")
    gate.set_tenant("team-b", {"gpu": 4}, cohort="research")
    gate.set_tenant("team-a", {"gpu": 4}, cohort="research")
    gate.submit("job-a", "team-a", {"gpu": 1})
    gate.submit("job-b", "team-b", {"gpu": 1})
    quota = schema.tenant_quota
    admitted: list[Placement] = []
    with gate.engine.connect() as holder:
        transaction = holder.begin()

        def touch(tenant: str) -> None:
            holder.execute(quota.update().where(quota.c.tenant == tenant)
                           .values(used=quota.c.used))

        touch("team-a")
        admitter = threading.Thread(target=lambda: admitted.extend(gate.admit(2)))
        admitter.start()
        wait_for(lambda: lock_waiters(gate.engine) > 0, "admission to wait for team-a's row",
                 interval=LOCK_POLL_SECONDS)
        # Locking in (tenant, resource) order, the waiting admission holds no member row
        # yet: this write gets team-b's at once (else each would wait for the other).
        touch("team-b")
        transaction.commit()
        admitter.join(30)
    assert not admitter.is_alive()
    assert sorted(placement.id for placement in admitted) == ["job-a", "job-b"]
    assert admission_stats.snapshot().reruns["deadlock"] == 0
    assert gate.check_invariants() == []


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_an_admitter_alone_whose_pick_another_transaction_holds_admits_the_next_without_waiting(
    gate: Quotagate,
) -> None:
    """Alone, MariaDB's admitter sends its lock with the batched writes (docs/decisions/053):
    a held pick fails the whole attempt, the rerun narrows and skips it, as a SKIP LOCKED
    SELECT does at once elsewhere. Either way: the next request, and no lock wait."""
    gate.set_pool("main", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 4})
    gate.submit("job-1", "team-a", {"gpu": 1})
    gate.submit("job-2", "team-a", {"gpu": 1})
    admitted: list[Placement] = []
    with gate.engine.connect() as holder:
        transaction = holder.begin()
        # Another transaction (a cancel, another admitter) holds job-1's row, not committed.
        holder.execute(sa.select(schema.request.c.id).where(schema.request.c.id == "job-1")
                       .with_for_update())
        admitter = threading.Thread(target=lambda: admitted.extend(gate.admit(1)))
        admitter.start()
        admitter.join(30)  # it must not need the lock to go away
        finished_while_held = not admitter.is_alive()
        transaction.rollback()
        admitter.join(30)
    assert finished_while_held
    assert [placement.id for placement in admitted] == ["job-2"]
    assert gate.show("job-1").state.value == "waiting"
    assert admission_stats.snapshot().reruns["stale_snapshot"] == (
        1 if batches_writes(gate.engine) else 0)
    assert gate.check_invariants() == []


@pytest.mark.parametrize("backend", [pytest.param("sqlite", marks=pytest.mark.sqlite)],
                         indirect=True)
def test_a_sqlite_admission_waiting_for_another_writer_records_that_wait_once(
    gate: Quotagate, db_url: str,
) -> None:
    gate.set_pool("main", {"gpu": 4})
    gate.set_tenant("team-a", {"gpu": 2})
    # The first admission runs the expiry pass (its own transaction, which would meet
    # the held lock first); on the manual clock it is not due again.
    assert gate.admit(1) == []
    admission_stats.reset()
    gate.submit("job-1", "team-a", {"gpu": 1})
    began = threading.Event()

    def trace(statement: str) -> None:  # called as a statement starts, before any busy wait
        if statement == "BEGIN IMMEDIATE":
            began.set()

    # Connections made from now on report their statements; admission's is one of them.
    sa.event.listen(gate.engine, "connect",
                    lambda connection, _record: connection.set_trace_callback(trace))
    gate.engine.dispose()
    admitted: list[Placement] = []
    holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
        admitter = threading.Thread(target=lambda: admitted.extend(gate.admit(1)))
        admitter.start()
        assert began.wait(30), "admission did not begin"
        blocked_at = time.perf_counter()
        time.sleep(HELD_SECONDS)  # hold the lock a known time: the wait must cover it
        holder.execute("COMMIT")
        held = time.perf_counter() - blocked_at
        admitter.join(30)
    finally:
        holder.close()
    assert not admitter.is_alive()
    assert [placement.id for placement in admitted] == ["job-1"]
    stats = admission_stats.snapshot()
    # One observation, the BEGIN's: the reserve and charges that follow cannot wait.
    assert stats.lock_wait_count == 1
    assert stats.lock_wait_sum >= held
    assert stats.reruns == dict.fromkeys(admission_stats.RERUN_CAUSES, 0)
