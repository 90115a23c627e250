"""Budgets and the fair-share half-life as a user sets them up: the CLI as subprocesses, and
the HTTP API over HTTP (docs/fair-sharing.md#budgets)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from support.cli import run
from support.http_servers import bearer, make_token, running_server


def test_budgets_from_the_cli(db_url: str, tmp_path: Path) -> None:
    def quotagate(*args: str, expect: int = 0) -> str:
        return run(*args, db=db_url, cwd=tmp_path, expect=expect).stdout

    quotagate("pool", "set", "pool-1", "--capacity", "gpu=8")
    quotagate("tenant", "set", "team-a", "--quota", "gpu=8", "--budget", "gpu=10h/30d",
              "--default-max-runtime", "2h")
    quotagate("submit", "--id", "a-1", "--tenant", "team-a", "--cost", "gpu=4")  # 8h reserved
    quotagate("submit", "--id", "a-2", "--tenant", "team-a", "--cost", "gpu=1",
              "--max-runtime", "3h")
    assert quotagate("admit", "--until-idle").strip() == "admitted 1"
    simulated = json.loads(quotagate("simulate", "--tenant", "team-a", "--cost", "gpu=1",
                                     "--max-runtime", "3h", "--json"))
    assert simulated["reasons"] == [
        {"code": "budget_exhausted", "resource": "gpu", "needed": 3.0, "available": 2.0}]
    assert "budget_exhausted: gpu needs 3h, 2h available" in quotagate("explain", "a-2")
    assert "  runtime: at most 3h (what a budget reserves)" in quotagate("show", "a-2")
    assert "  budget_exhausted: gpu needs 3h, 2h available" in quotagate(
        "simulate", "--tenant", "team-a", "--cost", "gpu=1", "--max-runtime", "3h")
    described = json.loads(quotagate("tenant", "show", "team-a", "--json"))
    assert described["default_max_runtime"] == 7200
    assert described["budget"]["gpu"]["limit"] == "10h/30d"
    shown = quotagate("tenant", "show", "team-a")
    assert "default max-runtime 2h" in shown and "budget gpu 10h/30d" in shown
    assert "invariants hold" in quotagate("check")
    bad = run("tenant", "set", "team-a", "--budget", "gpu=10h", db=db_url, cwd=tmp_path,
              expect=2)
    assert "invalid_budget" in bad.stderr
    quotagate("tenant", "set", "team-a", "--budget", "none")
    assert json.loads(quotagate("tenant", "show", "team-a", "--json"))["budget"] == {}
    assert "half-life of 1h" in quotagate("fair-share", "set", "--half-life", "1h")
    assert json.loads(quotagate("fair-share", "show", "--json")) == {"half_life": 3600}
    quotagate("fair-share", "set", "--half-life", "none")


def test_budgets_over_http(db_url: str, tmp_path: Path) -> None:
    admin_token = make_token(db_url)
    with running_server(db_url, tmp_path) as server, httpx.Client(
        base_url=server.url, headers=bearer(admin_token), timeout=30
    ) as admin:
        assert admin.put("/v1/pools/pool-1", json={"capacity": {"gpu": 8}}).status_code == 200
        tenant = admin.put("/v1/tenants/team-a", json={
            "quota": {"gpu": 8}, "budget": {"gpu": "4h/1d"}, "default_max_runtime": 3600})
        assert tenant.status_code == 200, tenant.text
        assert tenant.json()["budget"]["gpu"]["amount_hours"] == 4.0
        assert tenant.json()["default_max_runtime"] == 3600
        refused = admin.put("/v1/tenants/team-a", json={"budget": {"gpu": "4h/1m"}})
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_budget"
        dry = admin.post("/v1/tenants/team-a/requests", params={"dry_run": "true"},
                         json={"id": "a-dry", "cost": {"gpu": 2}, "max_runtime": 9000})
        assert dry.status_code == 200, dry.text
        assert dry.json()["reasons"] == [
            {"code": "budget_exhausted", "resource": "gpu", "needed": 5.0, "available": 4.0}]
        submitted = admin.post("/v1/tenants/team-a/requests",
                               json={"id": "a-1", "cost": {"gpu": 2}, "max_runtime": 7200})
        assert submitted.status_code == 202, submitted.text
        # A batch entry carries its own max-runtime, as a single submit does.
        batch = admin.post("/v1/tenants/team-a/requests:batch", json={"requests": [
            {"id": "a-b1", "cost": {"gpu": 1}, "max_runtime": 7200},
            {"id": "a-b2", "cost": {"gpu": 1}}]})
        assert batch.status_code == 200, batch.text
        assert [entry["request"]["max_runtime"] for entry in batch.json()["results"]] == [
            7200, None]
        explained = admin.get("/v1/tenants/team-a/requests/a-b1").json()
        assert explained["max_runtime"] == 7200
        budgets = admin.get("/v1/usage").json()["budgets"]
        assert [(row["tenant"], row["resource"], row["limit"]) for row in budgets] == [
            ("team-a", "gpu", "4h/1d")]
        removed = admin.put("/v1/tenants/team-a", json={"budget": {"gpu": None}})
        assert removed.status_code == 200 and removed.json()["budget"] == {}
        fair = admin.put("/v1/fair-share", json={"half_life": 3600})
        assert fair.status_code == 200 and fair.json() == {"half_life": 3600}
        assert admin.get("/v1/fair-share").json() == {"half_life": 3600}
        tenant_token = make_token(db_url, tenant="team-a")
        refused = httpx.put(f"{server.url}/v1/fair-share", json={"half_life": None},
                            headers=bearer(tenant_token))
        assert refused.status_code == 403


def test_stopping_work_at_its_max_runtime_from_the_cli(db_url: str, tmp_path: Path) -> None:
    """A real worker stops a real process once its 1 s max-runtime has passed (decision 714)."""
    def quotagate(*args: str, expect: int = 0) -> str:
        return run(*args, db=db_url, cwd=tmp_path, expect=expect).stdout

    quotagate("pool", "set", "pool-1", "--capacity", "gpu=2")
    quotagate("tenant", "set", "team-a", "--quota", "gpu=2", "--stop-at-max-runtime")
    described = json.loads(quotagate("tenant", "show", "team-a", "--json"))
    assert described["stop_at_max_runtime"] is True
    assert "work is stopped at its max-runtime" in quotagate("tenant", "show", "team-a")
    quotagate("target", "set", "local", "--kind", "process", "--default",
              "--command", "sleep 60", "--run-dir", "runs")
    quotagate("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1",
              "--max-runtime", "1s")
    # --until-idle returns once nothing is charged: the stop is confirmed and recorded.
    quotagate("worker", "--name", "w1", "--admit", "--until-idle", "--poll", "0.05")
    shown = json.loads(quotagate("show", "job-1", "--json"))
    assert (shown["state"], shown["reason"]) == ("timed_out", "max_runtime 1s exceeded")
    [run_dir] = [path for path in (tmp_path / "runs").iterdir() if not path.name.startswith(".")]
    assert (run_dir / "exit_status").read_text() == "-15"  # SIGTERM: stopped, not finished
    assert "invariants hold" in quotagate("check")
    quotagate("tenant", "set", "team-a", "--no-stop-at-max-runtime")
    assert json.loads(quotagate("tenant", "show", "team-a", "--json"))[
        "stop_at_max_runtime"] is False


def test_a_grace_past_the_max_runtime_from_the_cli(db_url: str, tmp_path: Path) -> None:
    """A real worker stops a real process at its 1 s max-runtime plus a 1 s grace
    (decision 715); bad values are refused with their code and change nothing."""
    def quotagate(*args: str, expect: int = 0) -> str:
        return run(*args, db=db_url, cwd=tmp_path, expect=expect).stdout

    quotagate("pool", "set", "pool-1", "--capacity", "gpu=2")
    quotagate("tenant", "set", "team-a", "--quota", "gpu=2", "--stop-at-max-runtime",
              "--max-runtime-grace", "1")
    assert json.loads(quotagate("tenant", "show", "team-a", "--json"))[
        "max_runtime_grace"] == 1
    assert ("work is stopped at its max-runtime (timed_out), after a grace of 1s"
            in quotagate("tenant", "show", "team-a"))
    for bad in ("-5", "1.5", "8d", "soon"):
        refused = run("tenant", "set", "team-a", f"--max-runtime-grace={bad}", db=db_url,
                      cwd=tmp_path, expect=2)
        assert "invalid_max_runtime_grace" in refused.stderr, refused.stderr
    assert json.loads(quotagate("tenant", "show", "team-a", "--json"))[
        "max_runtime_grace"] == 1
    quotagate("target", "set", "local", "--kind", "process", "--default",
              "--command", "sleep 60", "--run-dir", "runs")
    quotagate("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1",
              "--max-runtime", "1s")
    quotagate("worker", "--name", "w1", "--admit", "--until-idle", "--poll", "0.05")
    shown = json.loads(quotagate("show", "job-1", "--json"))
    assert (shown["state"], shown["reason"]) == ("timed_out",
                                                 "max_runtime 1s exceeded (grace 1s)")
    assert "invariants hold" in quotagate("check")
    assert "max_runtime_grace=1s" in quotagate("audit")


def test_stop_at_max_runtime_over_http(db_url: str, tmp_path: Path) -> None:
    admin_token = make_token(db_url)
    with running_server(db_url, tmp_path) as server, httpx.Client(
        base_url=server.url, headers=bearer(admin_token), timeout=30
    ) as admin:
        tenant = admin.put("/v1/tenants/team-a", json={"quota": {"gpu": 8}})
        assert tenant.status_code == 200 and tenant.json()["stop_at_max_runtime"] is False
        stops = admin.put("/v1/tenants/team-a", json={"stop_at_max_runtime": True})
        assert stops.status_code == 200 and stops.json()["stop_at_max_runtime"] is True
        kept = admin.put("/v1/tenants/team-a", json={"default_max_runtime": 60})
        assert kept.json()["stop_at_max_runtime"] is True  # absent: kept
        refused = admin.put("/v1/tenants/team-a", json={"stop_at_max_runtime": "yes"})
        assert refused.status_code == 422 and refused.json()["code"] == "invalid_input"
        assert admin.get("/v1/tenants/team-a").json()["stop_at_max_runtime"] is True
        off = admin.put("/v1/tenants/team-a", json={"stop_at_max_runtime": False})
        assert off.json()["stop_at_max_runtime"] is False
        assert off.json()["max_runtime_grace"] == 0
        grace = admin.put("/v1/tenants/team-a", json={"max_runtime_grace": 300})
        assert grace.status_code == 200 and grace.json()["max_runtime_grace"] == 300
        for bad, status, code in ((-1, 400, "invalid_max_runtime_grace"),
                                  (10**9, 400, "invalid_max_runtime_grace"),
                                  (1.5, 422, "invalid_input"), ("5m", 422, "invalid_input"),
                                  (True, 422, "invalid_input")):
            refused = admin.put("/v1/tenants/team-a", json={"quota": {"gpu": 1},
                                                           "max_runtime_grace": bad})
            assert (refused.status_code, refused.json()["code"]) == (status, code), bad
        shown = admin.get("/v1/tenants/team-a").json()
        assert shown["max_runtime_grace"] == 300 and shown["quota"]["gpu"]["cap"] == 8
        kept = admin.put("/v1/tenants/team-a", json={"max_runtime_grace": None})
        assert kept.json()["max_runtime_grace"] == 300  # null: kept
