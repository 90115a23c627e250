"""A target limited to some tenants looks, to every other tenant, like a target that
does not exist: the same 404, over the Python API, the CLI and HTTP, and nothing written.
See docs/decisions/311-target-tenants.md.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from quotagate import NotFound, Quotagate
from quotagate.auth.tokens import TokenStore
from quotagate.delivery.registry import TargetStore
from quotagate.http import create_app
from support import cli
from support.http_servers import serving
from support.ledger_state import snapshot


def _setup(gate: Quotagate) -> TargetStore:
    gate.set_pool("main", {"gpu": 10})
    for tenant in ("team-a", "team-b", "team-c"):
        gate.set_tenant(tenant, {"gpu": 5})
    targets = TargetStore(gate.engine)
    targets.set("gpu-farm", "webhook", {"url": "http://127.0.0.1:9/hooks"},
                tenants=["team-a", "team-b"])
    return targets


def _refusal(gate: Quotagate, request_id: str, tenant: str, target: str) -> NotFound:
    with pytest.raises(NotFound) as refused:
        gate.submit(request_id, tenant, {"gpu": 1}, target=target)
    return refused.value


def test_python_api_a_tenant_not_listed_gets_the_unknown_target_answer(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        _setup(gate)
        before = snapshot(gate)
        limited = _refusal(gate, "job-c", "team-c", "gpu-farm")
        unknown = _refusal(gate, "job-c", "team-c", "no-such")
        assert limited.code == unknown.code == "unknown_target"
        assert limited.status == unknown.status == 404
        assert limited.message == unknown.message.replace("no-such", "gpu-farm")
        assert snapshot(gate) == before
        assert gate.submit("job-a", "team-a", {"gpu": 1}, target="gpu-farm").created
        assert gate.submit("job-b", "team-b", {"gpu": 1}, target="gpu-farm").created


def test_replacing_a_target_keeps_its_tenants_until_told_otherwise(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        targets = _setup(gate)
        replaced = targets.set("gpu-farm", "webhook", {"url": "http://127.0.0.1:9/other"})
        assert replaced.tenants == ("team-a", "team-b")
        assert targets.resolve("gpu-farm").tenants == ("team-a", "team-b")
        _refusal(gate, "job-c", "team-c", "gpu-farm")
        opened = targets.set("gpu-farm", "webhook", {"url": "http://127.0.0.1:9/other"},
                             tenants=[])
        assert opened.tenants == ()
        assert gate.submit("job-c", "team-c", {"gpu": 1}, target="gpu-farm").created


def test_a_limited_default_target_refuses_other_tenants_requests_naming_none(
    db_url: str,
) -> None:
    with Quotagate.connect(db_url) as gate:
        targets = _setup(gate)
        targets.set("gpu-farm", "webhook", {"url": "http://127.0.0.1:9/hooks"}, default=True)
        before = snapshot(gate)
        with pytest.raises(NotFound) as refused:
            gate.submit("job-c", "team-c", {"gpu": 1})
        assert refused.value.code == "no_default_target"
        assert snapshot(gate) == before
        assert gate.submit("job-a", "team-a", {"gpu": 1}).created


def test_cli_target_set_with_tenants_and_a_refused_submit(db_url: str, tmp_path: Path) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 10})
        gate.set_tenant("team-a", {"gpu": 5})
        gate.set_tenant("team-c", {"gpu": 5})
    shown = cli.run("target", "set", "gpu-farm", "--kind", "webhook", "--url",
                    "http://127.0.0.1:9/hooks", "--tenants", "team-a,team-b",
                    db=db_url, cwd=tmp_path)
    assert "for tenants team-a, team-b" in shown.stdout
    listed = cli.run("target", "list", db=db_url, cwd=tmp_path)
    assert "team-a,team-b" in listed.stdout
    limited = cli.run("submit", "--id", "job-c", "--tenant", "team-c", "--cost", "gpu=1",
                      "--target", "gpu-farm", db=db_url, cwd=tmp_path, expect=4)
    unknown = cli.run("submit", "--id", "job-c", "--tenant", "team-c", "--cost", "gpu=1",
                      "--target", "no-such", db=db_url, cwd=tmp_path, expect=4)
    assert limited.stderr == unknown.stderr.replace("no-such", "gpu-farm")
    assert "unknown_target" in limited.stderr
    with Quotagate.connect(db_url) as gate, pytest.raises(NotFound):
        gate.show("job-c")
    cli.run("submit", "--id", "job-a", "--tenant", "team-a", "--cost", "gpu=1",
            "--target", "gpu-farm", db=db_url, cwd=tmp_path)
    cli.run("target", "set", "gpu-farm", "--kind", "webhook", "--url",
            "http://127.0.0.1:9/hooks", "--all-tenants", db=db_url, cwd=tmp_path)
    cli.run("submit", "--id", "job-c", "--tenant", "team-c", "--cost", "gpu=1",
            "--target", "gpu-farm", db=db_url, cwd=tmp_path)


def test_http_a_tenant_not_listed_gets_the_unknown_target_answer(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        _setup(gate)
        token = TokenStore(gate.engine).create(tenant="team-c").token
        before = snapshot(gate)
        with serving(create_app(gate)) as url, httpx.Client(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}
        ) as http:
            path = "/v1/tenants/team-c/requests"
            limited = http.post(path, json={"id": "job-c", "cost": {"gpu": 1},
                                            "target": "gpu-farm"})
            unknown = http.post(path, json={"id": "job-c", "cost": {"gpu": 1},
                                            "target": "no-such"})
            batch = http.post(f"{path}:batch", json={"requests": [
                {"id": "job-c", "cost": {"gpu": 1}, "target": "gpu-farm"}]})
        assert limited.status_code == unknown.status_code == 404
        assert limited.json()["code"] == unknown.json()["code"] == "unknown_target"
        assert limited.json()["message"] == unknown.json()["message"].replace("no-such", "gpu-farm")
        assert batch.json()["results"][0] == {"status": 404, "request": None,
                                              "error": limited.json()}
        assert snapshot(gate) == before
