"""Delivery's counters say what they count: giving up is not an executor's failure."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from quotagate import Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher


def _run_until(dispatcher: Dispatcher, gate: Quotagate, request_id: str,
               state: RequestState) -> None:
    deadline = time.monotonic() + 60
    while gate.show(request_id).state != state:
        assert time.monotonic() < deadline, gate.show(request_id)
        dispatcher.run_once()
        time.sleep(0.02)


def _ledger(tmp_path: Path, kind: str, config: dict[str, object]) -> Quotagate:
    gate = Quotagate.connect(f"sqlite:///{tmp_path / 'ledger.db'}")
    gate.init()
    gate.set_tenant("team-a", {"gpu": 1})
    gate.set_pool("pool-1", {"gpu": 1})
    gate.set_target("local", kind, config, default=True)
    gate.submit("job-1", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 1
    return gate


def test_an_executor_reporting_failure_counts_as_an_executor_failure(tmp_path: Path) -> None:
    with _ledger(tmp_path, "process", {"command": ["false"],
                                        "run_dir": str(tmp_path / "runs")}) as gate:
        before = gate.delivery_counters.snapshot()
        dispatcher = Dispatcher(gate, worker_name="w1", poll_interval=0.02)
        try:
            _run_until(dispatcher, gate, "job-1", RequestState.FAILED)
        finally:
            dispatcher.release()
        after = gate.delivery_counters.snapshot()
    assert after["executor_failed"] - before["executor_failed"] == 1
    assert after["given_up"] == before["given_up"]
    assert after["executor_completed"] == before["executor_completed"]


def test_delivery_giving_up_counts_as_given_up(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with _ledger(tmp_path, "webhook", {"url": f"http://127.0.0.1:{port}/hooks",
                                        "timeout": 1}) as gate:
        before = gate.delivery_counters.snapshot()
        dispatcher = Dispatcher(gate, worker_name="w1", max_attempts=1, retry_base=0.01)
        try:
            _run_until(dispatcher, gate, "job-1", RequestState.FAILED)
        finally:
            dispatcher.release()
        after = gate.delivery_counters.snapshot()
    assert after["given_up"] - before["given_up"] == 1
    assert after["executor_failed"] == before["executor_failed"]
