"""The spark target: a real Structured Streaming job per request, completed by its end, stopped by a stop.

On SQLite: the ledger side is the process target's, tested on every backend in
test_delivery_engine.py; each job here is a Spark driver process of its own
(docs/decisions/506-spark-target-on-the-process-target.md).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quotagate import InvalidInput, Quotagate, RequestState
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.naming import external_name
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.spark import SparkTarget
from quotagate.streaming import SinkStore
from quotagate.streaming.checkpoint import read_checkpoint
from quotagate.streaming.diagnose import StreamingLocation, diagnose
from quotagate.streaming.lab.checkpoint import FAST_START
from support.databases import fresh_database
from support.spark import require_spark, write_events
from support.spark_job import SINK_DB_VARIABLE
from support.waiting import wait_for

JOB = Path(__file__).resolve().parents[1] / "support" / "spark_job.py"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Quotagate, str]]:
    require_spark()
    with fresh_database("sqlite", tmp_path) as url, Quotagate.connect(url) as gate:
        gate.set_tenant("team-a", {"slots": 4})
        gate.set_pool("pool-1", {"slots": 4})
        sink_url = f"sqlite:///{tmp_path / 'business.db'}"
        # The worker's own environment holds the ledger's URL: the job must never see it.
        monkeypatch.setenv("QUOTAGATE_DB", url)
        monkeypatch.setenv(SINK_DB_VARIABLE, sink_url)
        monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", FAST_START)
        TargetStore(gate.engine).set("streaming", "spark", {
            "command": [sys.executable, str(JOB)], "run_dir": str(tmp_path / "runs"),
            "checkpoint_root": str(tmp_path / "checkpoints"),
            "environment": [SINK_DB_VARIABLE, "PYSPARK_SUBMIT_ARGS", "JAVA_HOME"], "stop_grace": 20,
        }, default=True)
        yield gate, sink_url


def processes_in(directory: Path) -> list[int]:
    """Processes whose working directory is ``directory`` (the job and the JVM it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == directory:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def deliver(gate: Quotagate, request_id: str, payload: dict[str, Any]) -> Dispatcher:
    gate.submit(request_id, "team-a", {"slots": 1}, payload=payload)
    assert gate.admit_until_idle() == 1
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.2)
    dispatcher.run_once()
    assert gate.show(request_id).state == RequestState.DELIVERED
    return dispatcher


@pytest.mark.spark
def test_a_streaming_job_runs_fenced_on_its_own_checkpoint_and_completes_the_request(
    ledger: tuple[Quotagate, str], tmp_path: Path
) -> None:
    gate, sink_url = ledger
    write_events(tmp_path / "in", "part-0.json", range(5))
    dispatcher = deliver(gate, "stream-1", {"source": str(tmp_path / "in"), "mode": "once"})
    assert gate.usage()["tenants"][0]["used"] == 1  # held while the query runs
    wait_for(lambda: dispatcher.run_once() is not None and gate.show("stream-1").state == RequestState.COMPLETED,
             "the query to end", timeout=240)
    dispatcher.release()

    name = external_name(gate.ledger_id, "team-a", "stream-1")
    checkpoint = tmp_path / "checkpoints" / gate.ledger_id / "team-a" / name
    assert read_checkpoint(checkpoint).commits == (0,)
    binding = gate.delivery_trail("stream-1").binding
    assert binding is not None
    with SinkStore(sink_url) as sink:
        assert sink.count_rows("events") == 5
        [marker] = sink.markers()
        assert marker.query == name  # $QUOTAGATE_QUERY_NAME
        assert (marker.request_id, marker.fencing_token) == ("stream-1", binding["fencing_token"])
        assert sink.fencing_token("stream-1") == binding["fencing_token"]
    # diagnose finds the checkpoint and the query name from the target by itself.
    layers = {layer.name: layer for layer in diagnose(gate, "stream-1", StreamingLocation(sink_url=sink_url))}
    assert layers["checkpoint"].facts["checkpoint"]["location"] == str(checkpoint)
    assert layers["checkpoint"].verdict.startswith("in step: the commit log and the sink both end at batch 0")
    assert layers["idempotency"].verdict == "1 batch(es), none written twice"
    seen = json.loads((tmp_path / "runs" / name / "environment.json").read_text())
    assert "QUOTAGATE_DB" not in seen and "QUOTAGATE_RATE_STORE" not in seen
    assert {"QUOTAGATE_REQUEST_ID", "QUOTAGATE_FENCING_TOKEN", "QUOTAGATE_CHECKPOINT_LOCATION"} <= set(seen)
    assert gate.usage()["tenants"][0]["used"] == 0


@pytest.mark.spark
def test_stopping_a_running_streaming_job_stops_its_query_and_returns_the_cost(
    ledger: tuple[Quotagate, str], tmp_path: Path
) -> None:
    gate, sink_url = ledger
    write_events(tmp_path / "in", "part-0.json", range(3))
    dispatcher = deliver(gate, "stream-2", {"source": str(tmp_path / "in"), "mode": "forever"})
    name = external_name(gate.ledger_id, "team-a", "stream-2")
    with SinkStore(sink_url) as sink:
        wait_for(lambda: sink.count_rows("events") == 3, "the first batch", timeout=240)
    assert len(processes_in(tmp_path / "runs" / name)) >= 2  # the Python driver and its JVM
    assert gate.show("stream-2").state == RequestState.DELIVERED  # a running query holds its cost
    gate.cancel("stream-2")
    wait_for(lambda: dispatcher.run_once() is not None and gate.show("stream-2").state == RequestState.CANCELLED,
             "the stop", timeout=120)
    dispatcher.release()
    status = int((tmp_path / "runs" / name / "exit_status").read_text())
    assert status != 0
    assert gate.usage()["tenants"][0]["used"] == 0
    # The driver's JVM was in the job's process group: it got the signal too.
    wait_for(lambda: not processes_in(tmp_path / "runs" / name), "the driver's JVM to exit", timeout=60)


@pytest.mark.parametrize(("config", "message"), [
    ({"checkpoint_root": "x"}, "exactly one of --module"),
    ({"module": "jobs.events", "command": "spark-submit job.py"}, "exactly one of --module"),
    ({"module": "not a module"}, "dotted Python module"),
    ({"module": "jobs.events", "environment": ["QUOTAGATE_DB"]}, "must not see QUOTAGATE_DB"),
])
def test_a_bad_spark_target_is_refused(config: dict[str, Any], message: str, tmp_path: Path) -> None:
    with fresh_database("sqlite", tmp_path) as url, Quotagate.connect(url) as gate:
        with pytest.raises(InvalidInput, match=message):
            TargetStore(gate.engine).set("streaming", "spark", config)
        assert TargetStore(gate.engine).list() == []


def test_a_module_job_runs_with_the_workers_interpreter_through_the_launcher(tmp_path: Path) -> None:
    target = SparkTarget({"module": "jobs.events", "checkpoint_root": str(tmp_path / "c")}, ledger_id="ledger-1")
    assert target.process.command[-3:] == [sys.executable, "-m", "jobs.events"]
    assert target.process.command[2:5] == [str(tmp_path / "c"), "ledger-1", "--"]
    assert target.checkpoint_location("team-a", "team-a-job-1-0123456789") == (
        tmp_path / "c" / "ledger-1" / "team-a" / "team-a-job-1-0123456789")
