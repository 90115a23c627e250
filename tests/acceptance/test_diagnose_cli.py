"""``quotagate diagnose`` walks a request through quota, lease, checkpoint and idempotency."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quotagate import Quotagate
from quotagate.store.audit import AuditEntry
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



def test_diagnose_shows_the_requests_audit_trail_of_its_own_tenant_only(
    db_url: str, tmp_path: Path
) -> None:
    db = db_url
    run("tenant", "set", "team-a", "--quota", "gpu=4", "--rate", "capacity=1,refill=0", db=db, cwd=tmp_path)
    run("tenant", "set", "team-b", "--quota", "gpu=4", db=db, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db, cwd=tmp_path)
    run("target", "set", "local", "--kind", "process", "--default", "--command", "true",
        "--run-dir", str(tmp_path / "runs"), db=db, cwd=tmp_path)
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path)
    run("submit", "--id", "job-2", "--tenant", "team-a", "--cost", "gpu=1", db=db, cwd=tmp_path, expect=5)
    run("worker", "--name", "w1", "--admit", "--until-idle", db=db, cwd=tmp_path)
    with Quotagate.connect(db) as gate:
        # Another tenant's caller named this id and was refused: that is team-b's record.
        gate.record_audit(AuditEntry("token:b", "request.read", "refused", "team-b", "job-1", "no"))

    shown = json.loads(run("diagnose", "job-1", "--json", db=db, cwd=tmp_path).stdout)
    trail = [(entry["actor"], entry["operation"], entry["outcome"], entry["tenant"])
             for entry in shown["audit"]]
    assert trail == [("cli", "submit", "accepted", "team-a"), ("admission", "admit", "reserved", "team-a"),
                     ("worker:w1", "deliver", "delivered", "team-a"),
                     ("worker:w1", "completed", "released", "team-a")]
    assert shown["audit_earlier"] is False
    assert all(isinstance(entry["at"], float) for entry in shown["audit"])

    text = run("diagnose", "job-1", db=db, cwd=tmp_path).stdout
    lines = text.splitlines()
    start = lines.index("audit trail (4 entries, oldest first):")
    assert lines[start + 1].split() == ["at", "actor", "operation", "outcome", "reason"]
    # The time says its zone (2026-12-07 19:20:00 UTC).
    assert lines[start + 3].split()[2:] == ["UTC", "cli", "submit", "accepted"]
    assert "token:b" not in text
    # The audit log, narrowed to the request: the same story, its times in UTC too.
    audited = run("audit", "--request", "job-1", db=db, cwd=tmp_path).stdout.splitlines()
    assert [line.split()[4:7] for line in audited[2:]] == [
        ["worker:w1", "team-a", "completed"], ["worker:w1", "team-a", "deliver"],
        ["admission", "team-a", "admit"], ["cli", "team-a", "submit"]]
    assert all(line.split()[3] == "UTC" for line in audited[2:])

    # A rejected request stops at the quota layer; its trail says who was refused, and when.
    rejected = json.loads(run("diagnose", "job-2", "--json", db=db, cwd=tmp_path).stdout)
    assert [layer["layer"] for layer in rejected["layers"]] == ["quota"]
    assert [(entry["operation"], entry["outcome"], entry["reason"]) for entry in rejected["audit"]] == [
        ("submit", "rejected", "rate quota exhausted: 0 tokens left")]
    assert "audit trail (1 entry, oldest first):" in run("diagnose", "job-2", db=db, cwd=tmp_path).stdout

    with Quotagate.connect(db) as gate:  # tenant-scoped: team-b sees nothing of team-a's request
        assert gate.audit_trail("job-1", tenant="team-b").entries == []
        assert len(gate.audit_trail("job-1", tenant="team-a").entries) == 4
        newest = gate.audit_trail("job-1", limit=2)
        assert [entry["operation"] for entry in newest.entries] == ["deliver", "completed"]
        assert newest.earlier
