"""``quotagate worker`` as real child processes, for the crash and concurrency tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.store import schema

WORKER = "from quotagate.cli.main import main; main()"
FAST_OPTIONS = ["--lease-ttl", "2", "--poll", "0.05", "--retry-base", "0.2"]
# For the crash tests: a 1.5 s lease, short enough for quick takeovers, long enough that
# a worker stalled on a loaded machine does not lose it between renewals.
CRASH_OPTIONS = ["--lease-ttl", "1.5", "--poll", "0.05", "--retry-base", "0.2"]


def start_worker(db_url: str, name: str, *extra: str, crash_at: str | None = None,
                 environment: dict[str, str] | None = None,
                 options: Sequence[str] = FAST_OPTIONS) -> subprocess.Popen[bytes]:
    env = {key: value for key, value in os.environ.items() if key != "QUOTAGATE_CRASH_AT"}
    # A worker that hangs is dumped by finish(): faulthandler prints every thread's stack on SIGABRT.
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(environment or {})
    if crash_at is not None:
        env["QUOTAGATE_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, "worker", "--db", db_url, "--name", name,
         *options, *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def start_crash_worker(db_url: str, name: str, *extra: str,
                       crash_at: str | None = None) -> subprocess.Popen[bytes]:
    """A worker with the crash tests' lease (``CRASH_OPTIONS``), killed at ``crash_at``."""
    return start_worker(db_url, name, *extra, crash_at=crash_at, options=CRASH_OPTIONS)


def submit_and_admit(gate: Quotagate, count: int, prefix: str = "job") -> list[str]:
    """``count`` one-gpu requests of team-a, submitted and admitted: work for the workers."""
    ids = [f"{prefix}-{index:03d}" for index in range(count)]
    for request_id in ids:
        gate.submit(request_id, "team-a", {"gpu": 1}, payload={"n": request_id})
    assert gate.admit_until_idle(batch=64) == count
    return ids


def finish(worker: subprocess.Popen[bytes], timeout: float = 120,
           allowed: tuple[int, ...] = (0, -signal.SIGKILL)) -> int:
    try:
        _out, err = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Hung: make it print where each of its threads is (start_worker's faulthandler).
        worker.send_signal(signal.SIGABRT)
        _out, err = worker.communicate(timeout=30)
        raise AssertionError(f"worker did not exit within {timeout:.0f} s; its threads:\n"
                             f"{err.decode(errors='replace')[-6000:]}") from None
    if worker.returncode not in allowed:
        raise AssertionError(f"worker exited {worker.returncode}: {err.decode()[-2000:]}")
    return worker.returncode


def stop_all(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for worker in workers:
        try:
            worker.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def table(gate: Quotagate, which: sa.Table) -> list[Any]:
    with gate.engine.connect() as connection:
        return list(connection.execute(sa.select(which)).mappings())


def wait_for_generation(gate: Quotagate, worker: str, above: int, timeout: float = 60) -> int:
    """Until ``worker`` holds its lease under a generation above ``above``; that generation."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        generation = {row["name"]: row["generation"]
                      for row in table(gate, schema.lease)}.get(f"worker/{worker}", 0)
        if generation > above:
            return int(generation)
        time.sleep(0.02)
    raise AssertionError(f"worker {worker} never took its lease")
