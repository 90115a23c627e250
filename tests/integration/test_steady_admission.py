"""SQLite ``admit(1)`` decided on its kept reads (quotagate.store.steady_admission,
docs/decisions/061): a failure in its transaction leaves nothing behind and the general
admission admits instead; two threads admitting on one ledger (one has the kept
connection, the other goes through the pool) each admit once, and the ledger balances.

Real SQLite files; the failure is raised inside the steady transaction after its first
write, as a failing statement would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.domain.placement import Placement
from quotagate.store.engine import create_engine
from quotagate.store.ledger import Ledger
from quotagate.store.steady_admission import SteadyAdmission
from support.databases import fresh_database

pytestmark = pytest.mark.sqlite


@pytest.fixture
def gate_and_ledger(tmp_path: Path) -> Iterator[tuple[Quotagate, Ledger]]:
    clock = ManualClock()
    with fresh_database("sqlite", tmp_path) as url:
        gate = Quotagate.connect(url, clock=clock)
        gate.set_pool("pool-1", {"gpu": 1000})
        gate.set_tenant("team-a", {"gpu": 100})
        gate.set_tenant("team-b", {"gpu": 100})
        ledger = Ledger(create_engine(url), clock=clock)
        yield gate, ledger
        ledger.close()
        ledger.engine.dispose()
        gate.close()


def _rows(gate: Quotagate, table: str) -> int:
    with gate.engine.connect() as connection:
        return int(connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_a_failure_inside_the_steady_transaction_leaves_nothing_and_the_general_path_admits(
    gate_and_ledger: tuple[Quotagate, Ledger], monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate, ledger = gate_and_ledger
    for index in range(4):
        gate.submit(f"r{index}", "team-a", {"gpu": 1})
    assert [p.id for p in ledger.admit(1)] == ["r0"]  # the general path; reads kept since
    failures: list[str] = []
    write = SteadyAdmission._write

    def failing(self: SteadyAdmission, cursor: Any, placement: Placement, *rest: Any) -> None:
        if not failures:
            # The reserve goes through, then the next statement fails.
            sql, bind = self._reserve
            cursor.execute(sql, bind({"now": 0.0, "id_0": placement.id, "pool_0": placement.pool}))
            failures.append(placement.id)
            raise RuntimeError("disk I/O error")
        write(self, cursor, placement, *rest)

    monkeypatch.setattr(SteadyAdmission, "_write", failing)
    assert [p.id for p in ledger.admit(1)] == ["r1"]
    assert failures == ["r1"]
    # One reservation of r1, charged once, one outbox row and one audit entry each.
    assert gate.show("r1").state.value == "reserved"
    used = {(row["tenant"], row["resource"]): row["used"] for row in gate.usage()["tenants"]}
    assert used[("team-a", "gpu")] == 2
    assert _rows(gate, "qg_outbox") == 2
    assert _rows(gate, "qg_audit WHERE operation = 'admit'") == 2
    assert gate.check_invariants() == []
    # And the steady path decides the next one again.
    assert [p.id for p in ledger.admit(1)] == ["r2"]


def test_two_threads_admitting_on_one_ledger_admit_each_request_once(
    gate_and_ledger: tuple[Quotagate, Ledger],
) -> None:
    gate, ledger = gate_and_ledger
    for index in range(120):
        gate.submit(f"r{index:03d}", "team-a" if index % 2 else "team-b", {"gpu": 1})
    placed: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def admit_all(slot: int) -> None:
        start.wait()
        while True:
            got = ledger.admit(1)
            if not got:
                return
            placed[slot] += [placement.id for placement in got]

    threads = [threading.Thread(target=admit_all, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    every = placed[0] + placed[1]
    assert sorted(every) == [f"r{index:03d}" for index in range(120)]  # each once
    assert _rows(gate, "qg_outbox") == 120
    assert gate.check_invariants() == []
