"""Admitters claiming tenants (docs/decisions/030, 044): the rerun when the claimed tenants
admit nothing, on every backend."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.domain.placement import Placement
from quotagate.store import admission_stats, schema, tenant_claims
from quotagate.store.driver import DriverTransaction
from quotagate.store.ledger import Ledger
from support.waiting import LOCK_POLL_SECONDS, lock_waiters, wait_for


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    admission_stats.reset()
    yield
    admission_stats.reset()


def _claimed_set_admits_nothing(gate: Quotagate) -> None:
    """team-a has work that fits; team-b (the only other) has only work that does not."""
    gate.set_tenant("team-a", {"gpu": 8})
    gate.set_tenant("team-b", {"gpu": 2})
    # A sliced pool: the ledger expects several admitters and claims tenants.
    gate.set_pool("pool-1", {"gpu": 8}, slices=2)
    gate.submit("a-0", "team-a", {"gpu": 1})
    gate.submit("b-0", "team-b", {"gpu": 2})
    gate.set_tenant("team-b", {"gpu": 1})  # now above team-b's cap: never fits


def test_claimed_tenants_that_admit_nothing_roll_back_and_wait_for_the_held_tenant(
    gate: Quotagate, backend: str,
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite has no row locks; its case is the test below")
    _claimed_set_admits_nothing(gate)
    quota = schema.tenant_quota
    admitted: list[Placement] = []
    with gate.engine.connect() as other_admitter:
        transaction = other_admitter.begin()
        # Another transaction holds team-a's quota rows, as an admitter charging it would:
        # the claim gets only team-b, whose work does not fit.
        other_admitter.execute(sa.select(quota.c.tenant).where(quota.c.tenant == "team-a")
                               .with_for_update()).all()
        admitter = threading.Thread(target=lambda: admitted.extend(gate.admit(4)))
        admitter.start()
        # The claimed set admitted nothing: rolled back, the rerun waits for team-a's rows.
        wait_for(lambda: lock_waiters(gate.engine) > 0, "the rerun to wait for team-a's rows",
                 interval=LOCK_POLL_SECONDS)
        assert admitted == []
        assert admission_stats.snapshot().reruns["claims_too_narrow"] == 1
        transaction.commit()
        admitter.join(30)
    assert not admitter.is_alive()
    assert [placement.id for placement in admitted] == ["a-0"]
    stats = admission_stats.snapshot().reruns
    assert stats == {"stale_snapshot": 0, "lock_timeout": 0, "deadlock": 0,
                     "claims_too_narrow": 1}
    assert gate.show("b-0").state.value == "waiting"
    assert gate.check_invariants() == []


def test_without_skip_locked_sqlite_claims_every_tenant_and_never_reruns(
    gate: Quotagate, backend: str,
) -> None:
    if backend != "sqlite":
        pytest.skip("the servers skip held rows: the test above")
    _claimed_set_admits_nothing(gate)
    # One writer: the claim is a plain read that gets every tenant, so the work that
    # fits is admitted in the first run.
    assert [placement.id for placement in gate.admit(4)] == ["a-0"]
    assert admission_stats.snapshot().reruns["claims_too_narrow"] == 0
    assert gate.show("b-0").state.value == "waiting"
    assert gate.check_invariants() == []


SERVERS = [pytest.param("postgresql", marks=pytest.mark.postgresql),
           pytest.param("mysql", marks=pytest.mark.mysql)]


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_an_admitter_that_saw_another_claims_free_tenants_in_fair_order_and_never_waits(
    gate: Quotagate,
) -> None:
    gate.set_pool("pool-1", {"gpu": 100})  # one slice: no claims until another admitter shows
    for tenant in ("team-a", "team-b", "team-c"):
        gate.set_tenant(tenant, {"gpu": 100})
        for index in range(4):
            gate.submit(f"{tenant[-1]}-{index}", tenant, {"gpu": 1})
    # Long enough that this test never depends on how fast the machine is.
    ledger = Ledger(gate.engine, clock=gate.ledger.clock, narrow_seconds=3600)
    request, quota = schema.request, schema.tenant_quota
    with gate.engine.connect() as other_admitter, other_admitter.begin():
        # Another admitter holds a-0, the head of the fair batch: SKIP LOCKED steps
        # around it, and this admitter now knows it is not alone.
        other_admitter.execute(sa.select(request.c.id).where(request.c.id == "a-0")
                               .with_for_update()).all()
        assert [placement.id for placement in ledger.admit(1)] == ["a-1"]
    admitted: list[Placement] = []
    with gate.engine.connect() as other_admitter, other_admitter.begin():
        # Another admitter is charging team-b (it holds team-b's quota rows).
        other_admitter.execute(sa.select(quota.c.tenant).where(quota.c.tenant == "team-b")
                               .with_for_update()).all()
        admitter = threading.Thread(target=lambda: admitted.extend(ledger.admit(8)))
        admitter.start()
        # A fair batch over every tenant would charge team-b and wait for it here.
        admitter.join(60)
        assert not admitter.is_alive(), "the admission waited for the held tenant"
    # Lowest dominant share first: team-c (nothing used), then team-a; team-b untouched.
    assert [placement.tenant for placement in admitted] == ["team-c"] * 4 + ["team-a"] * 3
    assert {placement.id for placement in admitted} == {
        "c-0", "c-1", "c-2", "c-3", "a-0", "a-2", "a-3"}
    assert all(gate.show(f"b-{index}").state.value == "waiting" for index in range(4))
    assert gate.check_invariants() == []


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_narrow_admitter_skips_dry_tenants_and_waits_for_the_held_one_without_a_rerun(
    gate: Quotagate,
) -> None:
    gate.set_pool("pool-1", {"gpu": 100})
    gate.set_tenant("team-a", {"gpu": 100})
    gate.set_tenant("team-b", {"gpu": 100})  # its queue is dry: nothing of it waits
    for index in range(4):
        gate.submit(f"a-{index}", "team-a", {"gpu": 1})
    ledger = Ledger(gate.engine, clock=gate.ledger.clock, narrow_seconds=3600)
    request, quota = schema.request, schema.tenant_quota
    with gate.engine.connect() as other_admitter, other_admitter.begin():
        # Another admitter holds a-0: this admitter now knows it is not alone.
        other_admitter.execute(sa.select(request.c.id).where(request.c.id == "a-0")
                               .with_for_update()).all()
        assert [placement.id for placement in ledger.admit(1)] == ["a-1"]
    # Narrow now: team-b (lowest share) is claimed first and read empty, then team-a.
    assert [placement.id for placement in ledger.admit(1)] == ["a-0"]
    # Finding out cost MariaDB's admitter, alone until then, one rerun (docs/decisions/053);
    # what follows must cost none.
    admission_stats.reset()
    admitted: list[Placement] = []
    with gate.engine.connect() as other_admitter:
        transaction = other_admitter.begin()
        # Another admitter is charging team-a, the only tenant with work; team-b (lowest
        # share, claimed first) is dry. Locking team-b would leave this admitter holding a
        # claim, unable to wait: it would roll back and run again (claims_too_narrow).
        # This admitter read team-b empty before: now it only asks whether team-b waits.
        other_admitter.execute(sa.select(quota.c.tenant).where(quota.c.tenant == "team-a")
                               .with_for_update()).all()
        admitter = threading.Thread(target=lambda: admitted.extend(ledger.admit(8)))
        admitter.start()
        wait_for(lambda: lock_waiters(gate.engine) > 0, "the admission to wait for team-a",
                 interval=LOCK_POLL_SECONDS)
        assert admission_stats.snapshot().reruns["claims_too_narrow"] == 0
        with gate.engine.connect() as observer:
            # team-b's rows were left alone: nobody holds them.
            assert observer.execute(sa.select(quota.c.tenant).where(quota.c.tenant == "team-b")
                                    .with_for_update(nowait=True)).all()
        transaction.commit()
        admitter.join(30)
    assert not admitter.is_alive()
    assert sorted(placement.id for placement in admitted) == ["a-2", "a-3"]
    assert admission_stats.snapshot().reruns == {
        "stale_snapshot": 0, "lock_timeout": 0, "deadlock": 0, "claims_too_narrow": 0}
    assert gate.check_invariants() == []


@contextlib.contextmanager
def _holding(gate: Quotagate, *tenants: str) -> Iterator[None]:
    """Another transaction holds ``tenants``' quota rows, as an admitter charging them would."""
    quota = schema.tenant_quota
    with gate.engine.connect() as other_admitter, other_admitter.begin():
        other_admitter.execute(sa.select(quota.c.tenant).where(quota.c.tenant.in_(tenants))
                               .with_for_update()).all()
        yield


def _three_tenants_with_work(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 100})
    for tenant in ("team-a", "team-b", "team-c"):
        gate.set_tenant(tenant, {"gpu": 100})
        for index in range(3):
            gate.submit(f"{tenant[-1]}-{index}", tenant, {"gpu": 1})


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgresql)],
                         indirect=True)
def test_claim_first_locks_only_the_first_free_tenant_and_reads_its_heads(
    gate: Quotagate,
) -> None:
    _three_tenants_with_work(gate)
    gate.set_tenant("team-d", {"gpu": 100})  # nothing of it waits
    quota = schema.tenant_quota
    resources = {tenant: {"gpu"} for tenant in ("team-a", "team-b", "team-c", "team-d")}
    raw = gate.engine.raw_connection()
    try:
        with _holding(gate, "team-a"):
            transaction = DriverTransaction(gate.engine.dialect, raw.cursor())
            # team-d was read empty before (dry): asked, not locked, not counted as held.
            got = tenant_claims.claim_first(
                transaction, ["team-d", "team-a", "team-b", "team-c"], resources,
                {"team-d"}, window=2)
            assert (got.index, got.claim, got.skipped, got.first_held) == (
                2, tenant_claims.Claim.CLAIMED, 1, 1)
            assert [head[0] for head in got.heads] == ["b-0", "b-1"]
            with gate.engine.connect() as observer:
                # Stopped at team-b: team-c, after it, and team-d, dry, were left alone.
                assert observer.execute(
                    sa.select(quota.c.tenant).where(quota.c.tenant.in_(["team-c", "team-d"]))
                    .with_for_update(skip_locked=True)).all() == [("team-c",), ("team-d",)]
                assert observer.execute(
                    sa.select(quota.c.tenant).where(quota.c.tenant == "team-b")
                    .with_for_update(skip_locked=True)).all() == []
            raw.rollback()
            # Nothing free: every tenant with work was held, the dry one is not counted.
            got = tenant_claims.claim_first(
                transaction, ["team-d", "team-a"], resources, {"team-d"}, window=2)
            assert (got.index, got.claim, got.skipped, got.first_held, got.heads) == (
                None, tenant_claims.Claim.SKIPPED, 1, 1, [])
            raw.rollback()
    finally:
        raw.close()


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgresql)],
                         indirect=True)
def test_a_narrow_admitter_tries_the_held_tenants_and_reads_its_own_in_one_statement(
    gate: Quotagate, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _three_tenants_with_work(gate)
    ledger = Ledger(gate.engine, clock=gate.ledger.clock, narrow_seconds=3600)
    with gate.engine.connect() as other_admitter, other_admitter.begin():
        # Another admitter holds a-0: this admitter now knows it is not alone.
        other_admitter.execute(sa.select(schema.request.c.id)
                               .where(schema.request.c.id == "a-0").with_for_update()).all()
        assert [placement.id for placement in ledger.admit(1)] == ["a-1"]
    statements: list[str] = []
    execute = DriverTransaction.execute

    def counted(self: DriverTransaction, statement: Any, parameters: Any) -> Any:
        statements.append(str(statement).split(None, 1)[0].upper())
        return execute(self, statement, parameters)

    monkeypatch.setattr(DriverTransaction, "execute", counted)
    with _holding(gate, "team-b", "team-c"):
        # Fair order b, c (nothing used), then a: b and c are held, a is claimed.
        admitted = ledger.admit(2)
    assert [placement.id for placement in admitted] == ["a-0", "a-2"]
    # Before the reserve: the snapshot, then the claims of b, c and a and a's head read,
    # all in one round trip (it was one per tenant tried, and one for the heads). The
    # reserve is the first statement that writes (on PostgreSQL a WITH … UPDATE).
    reserve = next(index for index, word in enumerate(statements) if word != "SELECT")
    assert statements[:reserve] == ["SELECT", "SELECT"]
    assert admission_stats.snapshot().reruns["claims_too_narrow"] == 0
    assert gate.check_invariants() == []
