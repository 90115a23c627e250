"""Cohorts as a user sets them up: the CLI as subprocesses, and the HTTP API over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from support.cli import run
from support.http_servers import bearer, make_token, running_server
from support.waiting import wait_for


def _tenant_row(usage: dict[str, Any], tenant: str) -> dict[str, Any]:
    return next(row for row in usage["tenants"] if row["tenant"] == tenant)


def test_cohorts_from_the_cli(db_url: str, tmp_path: Path) -> None:
    def quotagate(*args: str, expect: int = 0) -> str:
        return run(*args, db=db_url, cwd=tmp_path, expect=expect).stdout

    quotagate("pool", "set", "pool-1", "--capacity", "gpu=16")
    quotagate("cohort", "set", "org")
    shown = quotagate("cohort", "set", "research", "--parent", "org")
    assert "cohort research (parent: org, root: org)" in shown
    quotagate("tenant", "set", "team-a", "--quota", "gpu=4", "--cohort", "research",
              "--borrowing-limit", "gpu=2", "--weight", "2")
    quotagate("tenant", "set", "team-b", "--quota", "gpu=4", "--cohort", "org",
              "--lending-limit", "gpu=3")
    described = json.loads(quotagate("tenant", "show", "team-a", "--json"))
    assert (described["cohort"], described["cohort_root"], described["weight"]) == (
        "research", "org", 2)
    assert described["quota"]["gpu"]["borrowing_limit"] == 2
    assert "borrowing limit" in quotagate("tenant", "show", "team-a")
    for index in range(8):
        quotagate("submit", "--id", f"a-{index}", "--tenant", "team-a", "--cost", "gpu=1")
    assert quotagate("admit", "--until-idle").strip() == "admitted 6"
    inspected = json.loads(quotagate("inspect", "--json"))
    row = next(r for r in inspected["tenants"] if r["tenant"] == "team-a")
    assert (row["nominal"], row["borrowed"], row["cohort"]) == (4, 2, "research")
    assert {"cohort": "org", "resource": "gpu", "used": 6, "cap": 7} in inspected["cohorts"]
    table = quotagate("inspect")
    assert "borrowed" in table and "shared cap" in table
    assert "invariants hold" in quotagate("check")
    refused = run("tenant", "set", "team-c", "--quota", "gpu=1", "--borrowing-limit", "gpu=1",
                  db=db_url, cwd=tmp_path, expect=2)
    # The CLI names its options; the HTTP API its fields (below).
    assert refused.stderr == ("error: not_in_cohort: tenant 'team-c' is in no cohort: borrowing "
                              "and lending limits need one (--cohort)\n")
    no_quota = run("tenant", "set", "team-a", "--lending-limit", "cpu=1", db=db_url,
                   cwd=tmp_path, expect=2)
    assert no_quota.stderr == ("error: unknown_quota_resource: tenant 'team-a' has no quota for "
                               "'cpu': set its nominal quota first (--quota cpu=N)\n")
    looped = run("cohort", "set", "org", "--parent", "research", db=db_url, cwd=tmp_path,
                 expect=2)
    assert "cohort_cycle" in looped.stderr
    assert "research  org" in quotagate("cohort", "list")
    # A dry run: team-a is at nominal 4 + borrowing limit 2.
    simulated = json.loads(quotagate("simulate", "--tenant", "team-a", "--cost", "gpu=1",
                                     "--json"))
    assert simulated["admissible"] is False
    assert simulated["reasons"] == [
        {"code": "borrowing_limit", "resource": "gpu", "needed": 1, "available": 0}]
    # b's guaranteed 1 and the last unit of the room.
    answered = quotagate("simulate", "--tenant", "team-b", "--cost", "gpu=2", "--id", "b-0")
    assert answered.startswith("admissible now: queue position")
    assert "cohort_capacity: gpu needs 3, 2 available" in quotagate(
        "simulate", "--tenant", "team-b", "--cost", "gpu=3")
    assert json.loads(quotagate("show", "a-7", "--json"))["state"] == "waiting"
    missing = run("show", "b-0", db=db_url, cwd=tmp_path, expect=4)  # the dry run wrote nothing
    assert "unknown_request" in missing.stderr
    # A cap on priority.
    quotagate("tenant", "set", "team-b", "--max-priority", "5")
    greedy = run("submit", "--id", "b-9", "--tenant", "team-b", "--cost", "gpu=1",
                 "--priority", "6", db=db_url, cwd=tmp_path, expect=2)
    assert "priority_above_max" in greedy.stderr
    assert "maximum priority 5" in quotagate("tenant", "show", "team-b")
    quotagate("tenant", "set", "team-b", "--reclaim", "lower-priority",
              "--within-tenant", "lower-priority")
    assert "reclaim lower-priority, within tenant lower-priority" in quotagate(
        "tenant", "show", "team-b")
    bad = run("tenant", "set", "team-b", "--reclaim", "always", db=db_url, cwd=tmp_path,
              expect=2)
    assert "invalid_reclaim" in bad.stderr
    assert "on preempt fail" in quotagate("tenant", "show", "team-b")  # the default
    quotagate("tenant", "set", "team-b", "--on-preempt", "requeue")
    assert json.loads(quotagate("tenant", "show", "team-b", "--json"))["on_preempt"] == "requeue"
    bad = run("tenant", "set", "team-b", "--on-preempt", "retry", db=db_url, cwd=tmp_path,
              expect=2)
    assert "invalid_on_preempt" in bad.stderr
    assert "on preempt requeue" in quotagate("tenant", "show", "team-b")  # changed nothing
    quotagate("tenant", "set", "team-b", "--max-priority", "none")
    quotagate("tenant", "set", "team-b", "--lending-limit", "gpu=none")
    assert json.loads(quotagate("cohort", "show", "org", "--json"))["room"]["gpu"] == {
        "used": 6, "cap": 8}


def test_simulate_names_the_work_a_preemption_would_stop(db_url: str, tmp_path: Path) -> None:
    def quotagate(*args: str) -> str:
        return run(*args, db=db_url, cwd=tmp_path).stdout

    quotagate("pool", "set", "pool-1", "--capacity", "gpu=8")
    quotagate("cohort", "set", "research")
    quotagate("tenant", "set", "team-a", "--quota", "gpu=4", "--cohort", "research",
              "--reclaim", "any")
    quotagate("tenant", "set", "team-b", "--quota", "gpu=4", "--cohort", "research")
    quotagate("submit", "--id", "low", "--tenant", "team-b", "--cost", "gpu=8")
    assert quotagate("admit", "--until-idle").strip() == "admitted 1"  # b borrows a's 4
    answered = quotagate("simulate", "--tenant", "team-a", "--cost", "gpu=4")
    assert answered.startswith("would wait: queue position 1")
    assert "  would preempt low of team-b (reclaim, cost gpu=8, priority 0)" in answered
    assert json.loads(quotagate("show", "low", "--json"))["state"] == "reserved"  # still runs


def test_cohorts_over_http(db_url: str, tmp_path: Path) -> None:
    admin_token = make_token(db_url)
    with running_server(db_url, tmp_path) as server, httpx.Client(
        base_url=server.url, headers=bearer(admin_token), timeout=30
    ) as admin:
        assert admin.put("/v1/pools/pool-1", json={"capacity": {"gpu": 16}}).status_code == 200
        created = admin.put("/v1/cohorts/research", json={})
        assert created.status_code == 200, created.text
        assert created.json()["parent"] is None
        tenant = admin.put("/v1/tenants/team-a", json={
            "quota": {"gpu": 2}, "cohort": "research", "borrowing_limit": {"gpu": 1},
            "weight": 3})
        assert tenant.status_code == 200, tenant.text
        body = tenant.json()
        assert body["cohort"] == "research" and body["weight"] == 3
        assert body["quota"]["gpu"]["borrowing_limit"] == 1
        lender = admin.put("/v1/tenants/team-b", json={"quota": {"gpu": 2}, "cohort": "research"})
        assert lender.status_code == 200, lender.text
        # A tenant set without "cohort" keeps it.
        kept = admin.put("/v1/tenants/team-a", json={"quota": {"gpu": 2}, "max_priority": 7,
                                                      "reclaim": "any"})
        assert kept.json()["cohort"] == "research" and kept.json()["max_priority"] == 7
        assert kept.json()["reclaim"] == "any" and kept.json()["within_tenant"] == "never"
        assert kept.json()["on_preempt"] == "fail"
        requeues = admin.put("/v1/tenants/team-a", json={"on_preempt": "requeue"})
        assert requeues.status_code == 200 and requeues.json()["on_preempt"] == "requeue"
        unknown = admin.put("/v1/tenants/team-a", json={"on_preempt": "retry"})
        assert unknown.status_code == 400 and unknown.json()["code"] == "invalid_on_preempt"
        assert admin.get("/v1/tenants/team-a").json()["on_preempt"] == "requeue"
        refused = admin.put("/v1/tenants/team-a", json={"lending_limit": {"gpu": 5}})
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_lending_limit"
        # An HTTP answer names the body's fields, not the CLI's options.
        alone = admin.put("/v1/tenants/team-c", json={"quota": {"gpu": 1},
                                                      "borrowing_limit": {"gpu": 1}})
        assert (alone.status_code, alone.json()) == (400, {
            "code": "not_in_cohort",
            "message": "tenant 'team-c' is in no cohort: borrowing and lending limits need one "
                       '(set "cohort")'})
        no_quota = admin.put("/v1/tenants/team-a", json={"lending_limit": {"cpu": 1}})
        assert (no_quota.status_code, no_quota.json()) == (400, {
            "code": "unknown_quota_resource", "resource": "cpu",
            "message": "tenant 'team-a' has no quota for 'cpu': set its nominal quota first "
                       '(set "quota": {"cpu": N})'})
        missing = admin.put("/v1/tenants/team-c", json={"cohort": "nowhere"})
        assert missing.status_code == 404 and missing.json()["code"] == "unknown_cohort"
        looped = admin.put("/v1/cohorts/research", json={"parent": "research"})
        assert looped.status_code == 400 and looped.json()["code"] == "cohort_cycle"
        tenant_token = make_token(db_url, tenant="team-a")
        with httpx.Client(base_url=server.url, headers=bearer(tenant_token),
                          timeout=30) as client:
            greedy = client.post("/v1/tenants/team-a/requests",
                                 json={"id": "a-greedy", "cost": {"gpu": 1}, "priority": 8})
            assert greedy.status_code == 400 and greedy.json()["code"] == "priority_above_max"
            # More than nominal 2 + borrowing limit 1 could ever be: refused, as submit would.
            dry = client.post("/v1/tenants/team-a/requests", params={"dry_run": "true"},
                              json={"id": "a-dry", "cost": {"gpu": 4}})
            assert dry.status_code == 400, dry.text
            assert dry.json()["code"] == "cost_above_quota" and dry.json()["limit"] == 3
            assert client.get("/v1/tenants/team-a/requests/a-dry").status_code == 404
            for index in range(4):
                submitted = client.post("/v1/tenants/team-a/requests",
                                        json={"id": f"a-{index}", "cost": {"gpu": 1}})
                assert submitted.status_code in (200, 201, 202), submitted.text
            assert client.put("/v1/cohorts/other", json={}).status_code == 403
            # The server's admission loop admits 3: nominal 2 and 1 borrowed from team-b.
            usage = wait_for(lambda: (row := _tenant_row(admin.get("/v1/usage").json(),
                                                         "team-a"))["used"] == 3 and row,
                             "three admissions of team-a")
            assert (usage["nominal"], usage["borrowed"]) == (2, 1)
            own = client.get("/v1/usage").json()
            assert [row["tenant"] for row in own["tenants"]] == ["team-a"]
            assert own["cohorts"] == []
        full = admin.get("/v1/usage").json()
        assert {"cohort": "research", "resource": "gpu", "used": 3, "cap": 4} in full["cohorts"]
        assert _tenant_row(full, "team-b")["lent"] == 1
        assert admin.get("/v1/cohorts/research").json()["tenants"] == ["team-a", "team-b"]
        assert admin.get("/v1/cohorts/nowhere").status_code == 404
