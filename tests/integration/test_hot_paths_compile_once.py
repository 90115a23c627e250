"""The hot paths compile their statements once, on every backend.

The driver compiles a statement once per dialect and keeps it by the statement's
identity (docs/decisions/246); a builder whose statement is not cached is compiled
anew at every call, silently (docs/decisions/321 found one in the group release,
the largest part of its CPU). Each test warms a path once, then runs it again with
the same shape and asserts that nothing was compiled.
"""

from __future__ import annotations

from pathlib import Path

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.store import driver
from support.waiting import wait_for


def _compilations() -> int:
    return driver._compile.cache_info().misses + driver._numbered.cache_info().misses


def _ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 100})
    gate.set_pool("pool-1", {"gpu": 100})
    return gate


def test_a_second_submit_and_admission_compile_nothing(gate: Quotagate) -> None:
    ledger = _ledger(gate)

    def submit_and_admit(request_id: str) -> None:
        ledger.submit(request_id, "team-a", {"gpu": 1}, payload={"n": request_id})
        assert [placement.id for placement in ledger.admit(1)] == [request_id]

    submit_and_admit("warm-1")
    submit_and_admit("warm-2")  # the first admission may read what the second keeps
    before = _compilations()
    submit_and_admit("measured")
    assert _compilations() == before
    assert ledger.check_invariants() == []


def test_a_second_delivery_pass_compiles_nothing(gate: Quotagate, tmp_path: Path) -> None:
    ledger = _ledger(gate)
    TargetStore(ledger.engine, clock=ledger.clock).set(
        "local", "process", {"command": ["true"], "run_dir": str(tmp_path / "runs")},
        default=True,
    )
    dispatcher = Dispatcher(ledger, worker_name="compile-once", batch=1)

    def deliver_one(request_id: str) -> None:
        ledger.submit(request_id, "team-a", {"gpu": 1})
        assert len(ledger.admit(1)) == 1
        dispatcher.run_once()

        def ended() -> bool:
            dispatcher.run_once()
            return ledger.show(request_id).state is RequestState.COMPLETED

        wait_for(ended, f"{request_id} to complete")

    deliver_one("warm-1")
    deliver_one("warm-2")
    before = _compilations()
    deliver_one("measured")
    assert _compilations() == before
    assert ledger.check_invariants() == []
