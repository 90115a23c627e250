"""A process target's runs, as the stop tests watch them: the target, its run directories,
whether a run's process group still runs."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from quotagate import Quotagate
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from support.waiting import wait_for
from support.worker_processes import submit_and_admit


def process_target(gate: Quotagate, tmp_path: Path, command: str, **extra: Any) -> None:
    """The default target ``local``: ``sh -c command``, its runs under ``tmp_path/runs``."""
    TargetStore(gate.engine).set(
        "local", "process",
        {"command": ["sh", "-c", command], "run_dir": str(tmp_path / "runs"), **extra},
        default=True,
    )


def run_directories(tmp_path: Path) -> list[Path]:
    runs = tmp_path / "runs"
    return sorted(p for p in runs.iterdir() if not p.name.startswith(".")) if runs.exists() else []


def delivered_run(
    gate: Quotagate, tmp_path: Path, started: str
) -> tuple[str, Dispatcher, Path]:
    """One request delivered to the process target by a worker polling stops every 50 ms,
    once its run directory holds ``started``: its id, the worker and the run directory."""
    [request_id] = submit_and_admit(gate, 1)
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.05)
    dispatcher.run_once()
    [run] = run_directories(tmp_path)
    wait_for(lambda: (run / started).exists(), "the command to start")
    return request_id, dispatcher, run


def running_group(run: Path) -> int:
    """The process group of a run whose command started (its ``pid``, once written)."""
    return int(wait_for(lambda: (run / "pid").exists() and (run / "pid").read_text(),
                        "the command to start"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) no longer runs.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def kill_groups(groups: list[int]) -> None:
    """SIGKILL process groups a test left running on purpose (a forced end stops nothing)."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
