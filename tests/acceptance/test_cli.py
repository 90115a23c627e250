"""The quotagate CLI as a user runs it: a subprocess per command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.cli import QUOTAGATE, run


def test_the_ledger_tour(empty_db_url: str, tmp_path: Path) -> None:
    db_url = empty_db_url
    run("init", db=db_url, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", "--quota", "cpu=16", db=db_url, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=4", "--capacity", "cpu=32", db=db_url,
        cwd=tmp_path)
    first = run("submit", "--id", "job-0", "--tenant", "team-a", "--cost", "gpu=1",
                "--payload", '{"model": "m"}', "--json", db=db_url, cwd=tmp_path)
    assert json.loads(first.stdout)["state"] == "waiting"
    again = run("submit", "--id", "job-0", "--tenant", "team-a", "--cost", "gpu=1",
                "--payload", '{"model": "m"}', db=db_url, cwd=tmp_path)
    assert "already submitted" in again.stdout
    conflict = run("submit", "--id", "job-0", "--tenant", "team-a", "--cost", "gpu=2",
                   db=db_url, cwd=tmp_path, expect=3)
    assert "request_conflict" in conflict.stderr
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=2", db=db_url, cwd=tmp_path)
    explained = run("explain", "job-1", "--json", db=db_url, cwd=tmp_path)
    assert json.loads(explained.stdout)["position"] == 2
    admitted = run("admit", "--until-idle", db=db_url, cwd=tmp_path)
    assert admitted.stdout.strip() == "admitted 1"
    explained = run("explain", "job-1", db=db_url, cwd=tmp_path)
    assert "tenant quota: gpu needs 2" in explained.stdout
    shown = json.loads(run("show", "job-0", "--json", db=db_url, cwd=tmp_path).stdout)
    assert {"id", "tenant", "state", "cost", "priority", "pool", "created"} <= set(shown)
    assert shown["state"] == "reserved" and shown["pool"] == "pool-1"
    inspected = json.loads(run("inspect", "--json", db=db_url, cwd=tmp_path).stdout)
    assert {"tenant": "team-a", "resource": "gpu", "used": 1, "cap": 2,
            "nominal": 2, "cohort": None, "borrowed": 0, "lent": 0} in inspected["tenants"]
    assert {"pool": "pool-1", "resource": "gpu", "used": 1, "cap": 4} in inspected["pools"]
    assert [r["id"] for r in inspected["requests"]] == ["job-1", "job-0"]
    table = run("inspect", db=db_url, cwd=tmp_path).stdout
    assert "pending" in table and "team-a" in table
    completed = run("complete", "job-0", db=db_url, cwd=tmp_path)
    assert "returned gpu=1" in completed.stdout
    assert "returned nothing" in run("complete", "job-0", db=db_url, cwd=tmp_path).stdout
    assert run("admit", "--once", db=db_url, cwd=tmp_path).stdout.startswith("admitted job-1")
    cancelled = run("cancel", "job-1", "--reason", "no longer needed", db=db_url, cwd=tmp_path)
    # Reserved: a stop, confirmed by a worker (none runs here), so nothing returns yet.
    assert "job-1 is cancelling; returned nothing" in cancelled.stdout
    shown = json.loads(run("show", "job-1", "--json", db=db_url, cwd=tmp_path).stdout)
    assert shown["reason"] == "no longer needed"
    run("check", db=db_url, cwd=tmp_path)


@pytest.mark.parametrize(
    ("args", "code", "exit_code"),
    [
        (("submit", "--id", "x", "--tenant", "nobody", "--cost", "gpu=1"), "unknown_tenant", 4),
        (("submit", "--id", "x", "--tenant", "team-a", "--cost", "gpu=0"), "invalid_cost", 2),
        (("submit", "--id", "x", "--tenant", "team-a", "--cost", "gpu=x"), "invalid_cost", 2),
        (("submit", "--id", "x", "--tenant", "team-a", "--cost", "tpu=1"), "unknown_resource", 2),
        (("submit", "--id", "x", "--tenant", "team-a", "--cost", "gpu=1", "--payload", "{bad"),
         "invalid_payload", 2),
        (("submit", "--id", "x y", "--tenant", "team-a", "--cost", "gpu=1"),
         "invalid_request_id", 2),
        (("tenant", "set", "team-a", "--quota", "gpu=-1"), "invalid_quota", 2),
        (("show", "missing"), "unknown_request", 4),
    ],
)
def test_bad_input_is_refused_with_a_code_and_changes_nothing(
    tmp_path: Path, args: tuple[str, ...], code: str, exit_code: int
) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    run("init", db=db, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db, cwd=tmp_path)
    before = run("inspect", "--json", "--limit", "100", db=db, cwd=tmp_path).stdout
    result = run(*args, db=db, cwd=tmp_path, expect=exit_code)
    assert result.stderr.startswith(f"error: {code}: ")
    assert run("inspect", "--json", "--limit", "100", db=db, cwd=tmp_path).stdout == before


@pytest.mark.parametrize(
    "url",
    ["nonsense", "oracle://u@h/db", "sqlite://", "postgresql+asyncpg://u@h/db", "mysql://u@h"],
)
def test_bad_database_urls_are_refused(tmp_path: Path, url: str) -> None:
    result = run("init", db=url, cwd=tmp_path, expect=2)
    assert "invalid_database_url" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_uninitialised_database_says_to_run_init(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    result = run("show", "job-0", db=db, cwd=tmp_path, expect=6)
    assert "quotagate init" in result.stderr


def test_demo_runs_and_verifies_the_invariants(tmp_path: Path) -> None:
    result = subprocess.run([*QUOTAGATE, "demo", "--clients", "2", "--requests", "15",
                             "--admitters", "2"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "all 30 requests finished" in result.stdout
    assert "ledger check passed" in result.stdout
    assert (tmp_path / "quotagate-demo.db").exists()
