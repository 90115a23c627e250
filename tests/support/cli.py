"""Running the quotagate CLI as a user does: one subprocess per command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

QUOTAGATE = [sys.executable, "-m", "quotagate.cli"]


def run(*args: str, db: str, cwd: Path, expect: int = 0,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``quotagate ARGS`` against ``db`` (``env``: more variables); assert it exits
    with ``expect``."""
    environment = {**os.environ, "QUOTAGATE_DB": db, **(env or {})}
    result = subprocess.run([*QUOTAGATE, *args], capture_output=True, text=True, cwd=cwd,
                            env=environment, timeout=120)
    assert result.returncode == expect, (result.stdout, result.stderr)
    return result
