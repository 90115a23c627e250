"""`quotagate pool set --slices` as a user runs it: set, show, and a refused bad count."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run


def test_pool_set_slices_splits_the_capacity_and_show_tells_the_count(
    db_url: str, tmp_path: Path
) -> None:
    run("pool", "set", "pool-1", "--capacity", "gpu=8", "--slices", "4", db=db_url, cwd=tmp_path)
    shown = json.loads(run("pool", "show", "pool-1", "--json", db=db_url, cwd=tmp_path).stdout)
    assert shown["slices"] == 4
    assert shown["capacity"] == {"gpu": {"used": 0, "cap": 8}}
    assert "slices: 4" in run("pool", "show", "pool-1", db=db_url, cwd=tmp_path).stdout
    refused = run("pool", "set", "pool-1", "--slices", "0", db=db_url, cwd=tmp_path, expect=2)
    assert "invalid_slices" in refused.stderr or "slices must be" in refused.stderr
