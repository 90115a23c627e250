"""``quotagate diagnose`` walks a request through quota, lease, checkpoint and idempotency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.cli import run


def layers(db: str, cwd: Path, *arguments: str) -> dict[str, dict[str, Any]]:
    shown = json.loads(run("diagnose", *arguments, "--json", db=db, cwd=cwd).stdout)
    return {layer["layer"]: layer for layer in shown["layers"]}


def test_a_rejected_request_stops_at_the_quota_layer_and_a_delivered_one_names_its_generation(
    empty_db_url: str, tmp_path: Path
) -> None:
    db = empty_db_url
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=4", "--rate", "capacity=1,refill=0", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db, cwd=tmp_path)
    run("target", "set", "local", "--kind", "process", "--default", "--command", "true",
        "--run-dir", str(tmp_path / "runs"), db=db, cwd=tmp_path)
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)
    run("submit", "--id", "job-2", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path, expect=5)

    refused = layers(db, tmp_path, "job-2")
    assert list(refused) == ["quota"]
    assert refused["quota"]["state"] == "rejected"
    assert refused["quota"]["verdict"].startswith("rejected at the gate")

    run("worker", "--name", "w1", "--admit", "--until-idle", db=db, cwd=tmp_path)
    delivered = layers(db, tmp_path, "job-1")
    assert delivered["lease"]["worker"] == "w1"
    assert delivered["lease"]["claim_generation"] == delivered["lease"]["lease_generation_now"] == 1
    assert delivered["lease"]["verdict"].endswith("no takeover since")

    # The same worker name starts again: a new generation, so the old one's writes are refused.
    run("worker", "--name", "w1", "--once", db=db, cwd=tmp_path)
    taken = layers(db, tmp_path, "job-1")
    assert taken["lease"]["lease_generation_now"] == 2
    assert "taken over since" in taken["lease"]["verdict"]
    text = run("diagnose", "job-1", db=db, cwd=tmp_path).stdout
    assert text.splitlines()[0].startswith("quota ") and "lease " in text

