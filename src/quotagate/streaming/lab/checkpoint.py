"""Checkpoint: four real Spark runs, each its own driver process, over one checkpoint.

1. five rows, all written; 2. three more with the business write failing: the
process fails and the commit log does not move; 3. a restart replays exactly
that batch; 4. ``commits/1`` deleted and a restart: the engine runs batch 1
again, the sink converges (conflicts, no new rows), and what Spark does about
the tampered log is observed, not assumed (docs/streaming.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotagate.streaming.checkpoint import read_checkpoint
from quotagate.streaming.lab import checkpoint_job
from quotagate.streaming.lab.observations import Observation
from quotagate.streaming.sink_store import SinkStore
from quotagate.streaming.spark import require_spark

TABLE = "lab_business"
QUERY = "lab-checkpoint"
RUN_TIMEOUT = 600
# The JVM's C1 compiler and serial collector start a short driver in about half
# the time on a small machine; a caller's own PYSPARK_SUBMIT_ARGS wins.
FAST_START = '--driver-java-options "-XX:+UseSerialGC -XX:TieredStopAtLevel=1" pyspark-shell'
# Spark's words when a commit log file it means to write is already there.
TAMPER_GUARD = "concurrently using"


@dataclass
class Run:
    exit: int
    batches: list[int]
    end: dict[str, Any] = field(default_factory=dict)
    output: str = ""

    @property
    def message(self) -> str:
        return str(self.end.get("message", ""))


def run(url: str, workdir: Path) -> list[Observation]:
    require_spark()
    source = workdir / "checkpoint-source"
    checkpoint = workdir / "checkpoint"
    source.mkdir()
    with SinkStore(url) as business:
        _write_rows(source / "part-0.json", range(0, 5), "tenant-a")
        first = _run(url, source, checkpoint, workdir, "first", fail=False)
        rows_first = business.count_rows(TABLE)

        _write_rows(source / "part-1.json", range(5, 8), "tenant-b")
        failed = _run(url, source, checkpoint, workdir, "failed", fail=True)
        rows_failed = business.count_rows(TABLE)
        after_failure = read_checkpoint(checkpoint)

        replay = _run(url, source, checkpoint, workdir, "replay", fail=False)
        rows_replay = business.count_rows(TABLE)
        after_replay = read_checkpoint(checkpoint)
        reprocessed = 1 in failed.batches and 1 in replay.batches and 1 not in after_failure.commits \
            and 1 in after_replay.commits

        tampered = checkpoint / "commits" / "1"
        tampered.unlink()
        again = _run(url, source, checkpoint, workdir, "again", fail=False)
        rows_again = business.count_rows(TABLE)
        after_again = read_checkpoint(checkpoint)
        markers = {marker.batch_id: marker for marker in business.markers(QUERY)}
    batch1 = markers.get(1)
    return [
        Observation("checkpointFirstRun", {"exit": first.exit, "businessRows": rows_first},
                    {"batches": first.batches}),
        Observation("checkpointFailedBusiness", {"exit": failed.exit, "businessRows": rows_failed},
                    {"batches": failed.batches, "commitsAfter": list(after_failure.commits),
                     "offsetsAfter": list(after_failure.offsets)}),
        Observation("checkpointReplay", {"exit": replay.exit, "businessRows": rows_replay},
                    {"batches": replay.batches}),
        Observation("checkpointReplayBatches", {"epoch1Reprocessed": reprocessed},
                    {"commitsAfter": list(after_replay.commits)}),
        Observation("checkpointReplayAgain", {
            "exit": again.exit, "businessRows": rows_again, "epoch1Reprocessed": 1 in again.batches,
            "tamperGuardFired": again.exit != 0 and TAMPER_GUARD in again.message,
        }, {"batches": again.batches, "errorClass": again.end.get("error_class"),
            "error": again.message.splitlines()[0] if again.message else None,
            "commit1RestoredBySpark": 1 in after_again.commits}),
        Observation("checkpointIdempotency", {
            "batch": 1,
            "deliveries": batch1.deliveries if batch1 else 0,
            "conflicts": batch1.conflicts if batch1 else 0,
        }, {"markers": {str(key): marker.to_dict() for key, marker in markers.items()}}),
    ]


def _write_rows(path: Path, numbers: range, tenant: str) -> None:
    lines = [json.dumps({"event_id": f"event-{number}", "tenant": tenant, "amount": number}) for number in numbers]
    # Written beside the source and renamed in, so the file source never sees half a file.
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text("\n".join(lines) + "\n")
    os.replace(temporary, path)


def _run(url: str, source: Path, checkpoint: Path, workdir: Path, label: str, *, fail: bool) -> Run:
    command = [sys.executable, "-m", checkpoint_job.__name__, "--source", str(source),
               "--checkpoint", str(checkpoint), "--table", TABLE, "--query", QUERY]
    if fail:
        command.append("--fail")
    environment = {**os.environ, checkpoint_job.SINK_DB_VARIABLE: url, "SPARK_LOCAL_IP": "127.0.0.1"}
    environment.setdefault("PYSPARK_SUBMIT_ARGS", FAST_START)
    completed = subprocess.run(command, env=environment, stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=RUN_TIMEOUT, cwd=workdir)
    (workdir / f"checkpoint-{label}.log").write_text(completed.stdout + completed.stderr)
    batches: list[int] = []
    end: dict[str, Any] = {}
    for line in completed.stdout.splitlines():
        if line.startswith(checkpoint_job.BATCH_PREFIX):
            batches.append(int(json.loads(line[len(checkpoint_job.BATCH_PREFIX):])["batch_id"]))
        elif line.startswith(checkpoint_job.END_PREFIX):
            end = json.loads(line[len(checkpoint_job.END_PREFIX):])
    if not end:
        raise RuntimeError(f"the {label} Spark run ended (status {completed.returncode}) without a report: "
                           + (completed.stderr.strip().splitlines() or ["no output"])[-1])
    return Run(completed.returncode, batches, end, completed.stdout)
