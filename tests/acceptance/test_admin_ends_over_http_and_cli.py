"""An admin's complete or fail of running work over HTTP and from the CLI, on every SQL backend.

The application is the real one on the real database, served by uvicorn in a
thread; the CLI runs as a subprocess; a worker stops a real ``sleep`` under the
process target (docs/decisions/819, 820).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from quotagate import Quotagate, RequestState
from quotagate.auth.tokens import TokenStore
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.http import create_app
from quotagate.store import schema
from support import cli
from support.http_servers import bearer, serving
from support.ledger_state import snapshot
from support.process_runs import alive, kill_groups, process_target, run_directories, running_group
from support.waiting import wait_for
from support.worker_processes import table


@dataclass
class Platform:
    gate: Quotagate
    db_url: str
    tmp_path: Path
    http: httpx.Client
    admin: dict[str, str]
    tenant: dict[str, str]
    groups: list[int] = field(default_factory=list)  # left running by a forced end

    def running(self, request_id: str) -> tuple[Dispatcher, int]:
        """``request_id`` delivered to ``sleep 60``: the worker and the command's group."""
        self.gate.submit(request_id, "team-a", {"gpu": 1})
        assert self.gate.admit(1)
        dispatcher = Dispatcher(self.gate, worker_name=f"w-{request_id}", stop_poll=0.05)
        before = set(run_directories(self.tmp_path))
        dispatcher.run_once()
        [run] = set(run_directories(self.tmp_path)) - before
        group = running_group(run)
        assert self.gate.show(request_id).state == RequestState.DELIVERED and alive(group)
        return dispatcher, group


@pytest.fixture
def platform(db_url: str, tmp_path: Path) -> Iterator[Platform]:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 8})
        gate.set_tenant("team-a", {"gpu": 4})
        process_target(gate, tmp_path, "sleep 60")
        tokens = TokenStore(gate.engine)
        with serving(create_app(gate)) as url, httpx.Client(base_url=url, timeout=30) as http:
            platform = Platform(gate, db_url, tmp_path, http,
                                admin=bearer(tokens.create(admin=True).token),
                                tenant=bearer(tokens.create(tenant="team-a").token))
            try:
                yield platform
            finally:
                kill_groups(platform.groups)


def _path(request_id: str, verb: str) -> str:
    return f"/v1/tenants/team-a/requests/{request_id}/{verb}"


def _used(gate: Quotagate) -> int:
    return next(row["used"] for row in gate.usage()["tenants"]
                if row["tenant"] == "team-a" and row["resource"] == "gpu")


def _outcomes(gate: Quotagate, request_id: str) -> list[tuple[str, str]]:
    return [(row["operation"], row["outcome"])
            for row in sorted(table(gate, schema.audit), key=lambda row: row["id"])
            if row["target"] == request_id and row["operation"] in
            ("complete", "fail", "completed", "failed")]


def test_an_admins_http_complete_of_running_work_answers_202_and_holds_the_cost(
    platform: Platform,
) -> None:
    gate, http = platform.gate, platform.http
    dispatcher, group = platform.running("job-1")
    answer = http.post(_path("job-1", "complete"), headers=platform.admin)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["state"] == "completing" and body["released"] == {}
    assert alive(group) and _used(gate) == 1
    again = http.post(_path("job-1", "complete"), headers=platform.admin)
    assert again.status_code == 202 and again.json()["state"] == "completing"
    shown = http.get("/v1/tenants/team-a/requests/job-1", headers=platform.admin).json()
    assert shown["state"] == "completing"

    wait_for(lambda: dispatcher.run_once() is not None
             and gate.show("job-1").state == RequestState.COMPLETED, "the confirmed stop")
    assert not alive(group) and _used(gate) == 0
    done = http.post(_path("job-1", "complete"), headers=platform.admin)
    assert done.status_code == 200 and done.json()["released"] == {}  # returned once
    assert _outcomes(gate, "job-1") == [("complete", "stopping"), ("completed", "released")]
    dispatcher.release()


def test_an_admins_http_fail_with_force_ends_now_and_is_audited_forced(
    platform: Platform,
) -> None:
    gate, http = platform.gate, platform.http
    dispatcher, group = platform.running("job-2")
    platform.groups.append(group)
    answer = http.post(_path("job-2", "fail"), headers=platform.admin,
                       json={"reason": "executor lost", "force": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "failed" and answer.json()["released"] == {"gpu": 1}
    assert _used(gate) == 0
    assert _outcomes(gate, "job-2") == [("failed", "forced")]
    audit = http.get("/v1/audit?tenant=team-a", headers=platform.admin).json()["entries"]
    assert any(entry["target"] == "job-2" and entry["outcome"] == "forced" for entry in audit)
    story = http.get("/v1/dashboard/requests/team-a/job-2", headers=platform.admin)
    assert story.status_code == 200, story.text  # the dashboard's request page shows it too
    assert any(entry["outcome"] == "forced" for entry in story.json()["history"])
    dispatcher.release()


def test_force_is_an_admins_alone_and_a_refusal_changes_nothing(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    dispatcher, group = platform.running("job-3")
    before = snapshot(gate)
    refused = http.post(_path("job-3", "complete"), headers=platform.tenant,
                        json={"force": True})
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "admin_only"
    bad = http.post(_path("job-3", "cancel"), headers=platform.admin, json={"force": True})
    assert bad.status_code == 400, bad.text
    assert bad.json()["code"] == "invalid_force"
    assert snapshot(gate) == before and alive(group)
    dispatcher.release()
    kill_groups([group])


def test_a_batch_of_admin_ends_answers_202_for_each_stop_it_asked(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    dispatcher, group = platform.running("job-4")
    gate.submit("job-5", "team-a", {"gpu": 1})
    assert gate.admit(1)  # reserved, no worker took it up: ends at once
    answer = http.post("/v1/tenants/team-a/requests:end", headers=platform.admin,
                       json={"ends": [{"id": "job-4", "state": "failed", "reason": "bad"},
                                      {"id": "job-5", "state": "completed"}]})
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["results"]
    assert first["status"] == 202 and first["request"]["state"] == "failing"
    assert first["released"] == {}
    assert second["status"] == 200 and second["released"] == {"gpu": 1}
    assert _used(gate) == 1 and alive(group)
    wait_for(lambda: dispatcher.run_once() is not None
             and gate.show("job-4").state == RequestState.FAILED, "the confirmed stop")
    assert _used(gate) == 0 and gate.show("job-4").reason == "bad"
    dispatcher.release()


def test_the_cli_complete_says_the_stop_was_asked_and_force_returns_the_cost(
    platform: Platform,
) -> None:
    gate = platform.gate
    dispatcher, group = platform.running("job-6")
    asked = cli.run("complete", "job-6", db=platform.db_url, cwd=platform.tmp_path)
    assert "job-6 is completing; returned nothing yet" in asked.stdout
    assert "confirm the stop" in asked.stdout
    assert alive(group) and _used(gate) == 1
    dispatcher.release()  # the worker is lost: the stop is never carried out
    forced = cli.run("complete", "job-6", "--force", db=platform.db_url, cwd=platform.tmp_path)
    platform.groups.append(group)
    assert "job-6 is completed; returned gpu=1" in forced.stdout
    assert _used(gate) == 0
    assert _outcomes(gate, "job-6") == [("complete", "stopping"), ("completed", "forced")]
    helped = cli.run("complete", "--help", db=platform.db_url, cwd=platform.tmp_path)
    assert "--force" in helped.stdout and "completing" in helped.stdout
