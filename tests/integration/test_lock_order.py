"""One lock order for admission and release (docs/decisions/041-one-lock-order.md).

Admitting and releasing processes over cohort members and plain tenants and
a sliced pool, with preemption and requeue of one tenant's work and a worker
confirming the stops, each doing a fixed number of operations: no transaction may
meet a deadlock (PostgreSQL would stall both for ``deadlock_timeout``, MariaDB
rolls one back), and the ledger's invariants hold afterwards. Row locks that
make a transaction wait exist on the servers only (SQLite has one writer).
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from quotagate import Quotagate, RequestState
from quotagate.domain.placement import Placement
from quotagate.store import schema
from quotagate.store.engine import create_engine
from quotagate.store.release import lock_decisions
from support import lock_order_workers
from support.racing import race_mixed
from support.waiting import lock_waiters, wait_for

SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mysql", marks=pytest.mark.mysql)]
# InnoDB refreshes the lock-wait table at most every 0.1 s (support.waiting.lock_waiters).
LOCK_POLL_SECONDS = 0.2
ADMITTERS = 3
RELEASERS = 3
ROUNDS = 40
WAITING_PER_TENANT = 100
# Members sort before the plain tenants: an order by name alone and one that takes
# plain tenants before members cross on exactly these rows.
MEMBERS = ("team-a", "team-b")
PLAIN = ("team-c", "team-d")
PREEMPTING = "team-d"


def _pg_deadlocks(url: str) -> int:
    """This database's deadlocks as PostgreSQL counts them, once no other session is left.

    A backend reports its counters when it exits, before it leaves
    pg_stat_activity: with every other session of the database gone, the count is final.
    """
    engine = create_engine(url)
    try:
        def alone() -> bool:
            with engine.connect() as connection:
                return not connection.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()").scalar_one()

        wait_for(alone, "the other sessions of the test database to end", timeout=60)
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            return int(connection.exec_driver_sql(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            ).scalar_one())
    finally:
        engine.dispose()


def _mysql_latest_deadlock(url: str) -> str:
    """The section of ``SHOW ENGINE INNODB STATUS`` on the server's latest deadlock."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            status = str(connection.exec_driver_sql("SHOW ENGINE INNODB STATUS").one()[2])
    finally:
        engine.dispose()
    start = status.find("LATEST DETECTED DEADLOCK")
    if start < 0:
        return ""
    end = status.find("\nTRANSACTIONS\n", start)
    return status[start:end]


def _setup(gate: Quotagate) -> None:
    gate.set_pool("main", {"gpu": 20, "cpu": 20}, slices=4)
    gate.set_pool("spare", {"gpu": 4, "cpu": 6})
    gate.set_cohort("research")
    for tenant in MEMBERS:
        gate.set_tenant(tenant, {"gpu": 5, "cpu": 5}, cohort="research",
                        borrowing_limit={"gpu": 3, "cpu": 3})
    for tenant in PLAIN:
        gate.set_tenant(tenant, {"gpu": 5, "cpu": 5})
    # Its higher-priority work stops its lower-priority work, which goes back to the queue.
    gate.set_tenant(PREEMPTING, {}, within_tenant="lower-priority", on_preempt="requeue")
    shapes = ({"gpu": 1, "cpu": 1}, {"gpu": 2, "cpu": 1}, {"cpu": 1}, {"gpu": 1})
    for tenant in (*MEMBERS, *PLAIN):
        for index in range(WAITING_PER_TENANT):
            gate.submit(f"{tenant}-{index:03d}", tenant, shapes[index % len(shapes)],
                        priority=0 if tenant == PREEMPTING else index % 3)
    # Something to release from the first round on.
    assert gate.admit_until_idle(batch=8) > 10
    # Work that outranks what the preempting tenant runs: a pass that admits
    # nothing stops some of it.
    for index in range(WAITING_PER_TENANT // 4):
        gate.submit(f"{PREEMPTING}-high-{index:03d}", PREEMPTING, {"gpu": 1}, priority=5)


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_admitting_and_releasing_processes_never_deadlock(db_url: str, backend: str) -> None:
    with Quotagate.connect(db_url) as gate:
        _setup(gate)
    deadlocks_before = _pg_deadlocks(db_url) if backend == "postgresql" else 0
    latest_before = _mysql_latest_deadlock(db_url) if backend == "mysql" else ""
    database = sa.engine.make_url(db_url).database
    jobs = [(lock_order_workers.admit_rounds, (db_url, ROUNDS, 4))
            for _ in range(ADMITTERS)]
    jobs += [(lock_order_workers.release_rounds, (db_url, ROUNDS, 6, seed))
             for seed in range(RELEASERS)]
    jobs.append((lock_order_workers.confirm_stop_rounds, (db_url, ROUNDS, 0)))
    answers = race_mixed(jobs)
    admitted = sum(done for kind, done, _deadlocks, _bound in answers if kind == "admit")
    released = sum(done for kind, done, _deadlocks, _bound in answers if kind == "release")
    met = {kind: 0 for kind in ("admit", "release", "stop")}
    for kind, _done, deadlocks, _bound in answers:
        met[kind] += deadlocks
    assert admitted > 20 and released > 20  # both sides did their work, side by side
    assert met == {"admit": 0, "release": 0, "stop": 0}
    if backend == "postgresql":
        assert _pg_deadlocks(db_url) == deadlocks_before
    else:
        latest = _mysql_latest_deadlock(db_url)
        assert latest == latest_before or f"`{database}`" not in latest, latest
    with Quotagate.connect(db_url) as gate:
        assert gate.check_invariants() == []


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_preemption_decision_never_waits_for_a_victim_another_transaction_holds(
    gate: Quotagate,
) -> None:
    gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority")
    gate.set_pool("main", {"gpu": 2})
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    assert [placement.id for placement in gate.admit()] == ["low"]
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    request = schema.request
    decided: list[object] = []
    with gate.engine.connect() as releaser:
        transaction = releaser.begin()
        # A batched release holding the victim's row, as one that also confirms
        # some other stop holds it while it waits for the decision lock.
        releaser.execute(sa.select(request.c.id).where(request.c.id == "low")
                         .with_for_update()).all()
        decision = threading.Thread(target=lambda: decided.append(gate.ledger.preempt()))
        decision.start()
        wait_for(lambda: not decision.is_alive() or lock_waiters(gate.engine),
                 "the decision to end or to wait", interval=LOCK_POLL_SECONDS)
        # The release's next lock. Had the decision waited for the victim's row, it
        # would hold this one: each would wait for the other.
        lock_decisions(releaser)
        transaction.commit()
        decision.join(30)
    assert decided == [None]  # it stepped around the held victim, holding nothing
    assert gate.show("low").state == RequestState.RESERVED
    chosen = gate.ledger.preempt()
    assert chosen is not None and [victim.id for victim in chosen.victims] == ["low"]
    assert gate.show("low").state == RequestState.PREEMPTING


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_slice_claim_holds_only_the_slice_it_charges(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 8, "cpu": 8})
    gate.set_pool("main", {"gpu": 8, "cpu": 8}, slices=4)
    gate.submit("job", "team-a", {"gpu": 1, "cpu": 1})
    capacity = schema.pool_capacity

    def row(number: int, resource: str) -> sa.Select[tuple[int]]:
        return (sa.select(capacity.c.slice)
                .where(capacity.c.pool == "main", capacity.c.slice == number,
                       capacity.c.resource == resource).with_for_update())

    admitted: list[Placement] = []
    with gate.engine.connect() as releaser:
        transaction = releaser.begin()
        # A release returning to slice 0's gpu and next to slice 1's cpu, in key order.
        releaser.execute(row(0, "gpu")).all()
        admitter = threading.Thread(target=lambda: admitted.extend(gate.admit(1)))
        admitter.start()
        # Best fit among equal slices is slice 0: claimed on cpu, then its gpu row waited for.
        wait_for(lambda: lock_waiters(gate.engine), "the admission to wait for slice 0's gpu",
                 interval=LOCK_POLL_SECONDS)
        # Had the claim kept every fitting slice's cpu row, this would close a cycle.
        assert releaser.execute(row(1, "cpu")).all() == [(1,)]
        transaction.commit()
        admitter.join(30)
    assert [placement.id for placement in admitted] == ["job"]
    assert gate.check_invariants() == []


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_moving_a_cohort_takes_its_members_rows_in_key_order(gate: Quotagate) -> None:
    gate.set_cohort("old-root")
    gate.set_cohort("new-root")
    gate.set_cohort("lab", parent="old-root")
    # team-b's rows are written first: a scan in storage order meets them before team-a's.
    for tenant in ("team-b", "team-a"):
        gate.set_tenant(tenant, {"gpu": 4, "cpu": 4}, cohort="lab")
    quota = schema.tenant_quota

    def rows_of(tenant: str, *, nowait: bool = False) -> sa.Select[tuple[str]]:
        return (sa.select(quota.c.resource).where(quota.c.tenant == tenant)
                .order_by(quota.c.resource).with_for_update(nowait=nowait))

    moved: list[dict[str, object]] = []
    with gate.engine.connect() as admitter:
        transaction = admitter.begin()
        # An admission (or a release) charging both members locks them in key order.
        admitter.execute(rows_of("team-a")).all()
        mover = threading.Thread(
            target=lambda: moved.append(gate.set_cohort("lab", parent="new-root")))
        mover.start()
        wait_for(lambda: lock_waiters(gate.engine), "the move to wait for team-a's rows",
                 interval=LOCK_POLL_SECONDS)
        # The admission's next locks, free: had the move taken team-b's rows before
        # waiting for team-a's, each transaction would wait for the other.
        assert admitter.execute(rows_of("team-b", nowait=True)).all() == [("cpu",), ("gpu",)]
        transaction.commit()
        mover.join(30)
    assert [described["root"] for described in moved] == ["new-root"]
    assert gate.check_invariants() == []


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_tenant_change_takes_its_quota_rows_in_key_order(gate: Quotagate) -> None:
    gate.set_cohort("lab")
    # gpu's row is written first: a scan in storage order meets it before cpu's.
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_tenant("team-a", {"cpu": 4})
    quota = schema.tenant_quota

    def row(resource: str, *, nowait: bool = False) -> sa.Select[tuple[int]]:
        return (sa.select(quota.c.cap).where(quota.c.tenant == "team-a",
                                             quota.c.resource == resource)
                .with_for_update(nowait=nowait))

    changed: list[dict[str, dict[str, int]]] = []
    with gate.engine.connect() as admitter:
        transaction = admitter.begin()
        # An admission charging cpu and gpu locks (team-a, cpu) first.
        admitter.execute(row("cpu")).all()
        # Joining a cohort rewrites every quota row of the tenant (their root).
        changer = threading.Thread(
            target=lambda: changed.append(gate.set_tenant("team-a", {"gpu": 6}, cohort="lab")))
        changer.start()
        wait_for(lambda: lock_waiters(gate.engine), "the change to wait for team-a's cpu row",
                 interval=LOCK_POLL_SECONDS)
        # Had the change taken gpu's row before waiting for cpu's, this would close a cycle.
        assert admitter.execute(row("gpu", nowait=True)).all() == [(4,)]
        transaction.commit()
        changer.join(30)
    assert changed == [{"cpu": {"used": 0, "cap": 4}, "gpu": {"used": 0, "cap": 6}}]
    assert gate.check_invariants() == []
