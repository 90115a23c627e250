"""Admitters claiming tenants (docs/decisions/030, 044): the rerun when the claimed tenants
admit nothing, on every backend."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.domain.placement import Placement
from quotagate.store import admission_stats, schema
from support.lock_waits import LOCK_POLL_SECONDS, lock_waiters
from support.waiting import wait_for


@pytest.fixture(autouse=True)
def fresh_counters() -> Iterator[None]:
    admission_stats.reset()
    yield
    admission_stats.reset()


def _claimed_set_admits_nothing(gate: Quotagate) -> None:
    """team-a has work that fits; team-b (the only other) has only work that does not."""
    gate.set_tenant("team-a", {"gpu": 8})
    gate.set_tenant("team-b", {"gpu": 1})
    # A sliced pool: the ledger expects several admitters and claims tenants.
    gate.set_pool("pool-1", {"gpu": 8}, slices=2)
    gate.submit("a-0", "team-a", {"gpu": 1})
    gate.submit("b-0", "team-b", {"gpu": 2})  # above team-b's cap: never fits


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
