"""A process target's runs, as the stop tests watch them: the target, its run directories,
whether a run's process group still runs."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from quotagate import Quotagate
from quotagate.delivery.registry import TargetStore


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
