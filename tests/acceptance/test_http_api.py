"""The HTTP API through a real `quotagate serve` over HTTP, on every SQL backend.

One server per backend for the module (starting one costs seconds); every test
uses its own tenants and request ids, so tests do not see each other's work.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from quotagate import Quotagate
from support.databases import BACKENDS, fresh_database
from support.http_servers import Server, bearer, make_token, put_stalled_tenant, running_server
from support.waiting import wait_for

DEADLINE = 30.0


@dataclass
class Api:
    server: Server
    db_url: str
    admin: httpx.Client

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, headers=bearer(token), timeout=30)

    def tenant(self, quota: dict[str, int] | None = None) -> tuple[str, httpx.Client]:
        """A fresh tenant with a quota, and a client holding a token scoped to it."""
        name = f"t-{uuid.uuid4().hex[:10]}"
        response = self.admin.put(f"/v1/tenants/{name}", json={"quota": quota or {"gpu": 4}})
        assert response.status_code == 200, response.text
        return name, self.client(make_token(self.db_url, tenant=name))

    def stalled_tenant(self) -> tuple[str, httpx.Client]:
        """A fresh tenant whose requests all stay waiting, and a client scoped to it."""
        name = f"t-{uuid.uuid4().hex[:10]}"
        put_stalled_tenant(self.admin, name)
        return name, self.client(make_token(self.db_url, tenant=name))


@pytest.fixture(scope="module", params=BACKENDS)
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp_path = tmp_path_factory.mktemp(f"http-{request.param}")
    with fresh_database(str(request.param), tmp_path) as db_url:
        admin_token = make_token(db_url)
        with running_server(db_url, tmp_path) as server, httpx.Client(
            base_url=server.url, headers=bearer(admin_token), timeout=30
        ) as admin:
            response = admin.put("/v1/pools/shared", json={"capacity": {"gpu": 1000, "cpu": 1000}})
            assert response.status_code == 200, response.text
            yield Api(server, db_url, admin)


def new_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def wait_for_state(client: httpx.Client, path: str, states: set[str]) -> dict[str, Any]:
    until = time.monotonic() + DEADLINE
    while True:
        body: dict[str, Any] = client.get(path).json()
        if body.get("state") in states:
            return body
        if time.monotonic() > until:
            pytest.fail(f"{path} never reached {states}; last: {body}")
        time.sleep(0.05)


def test_admin_sets_and_reads_tenants_pools_and_usage(api: Api) -> None:
    name, _ = api.tenant({"gpu": 2, "cpu": 8})
    tenant = api.admin.get(f"/v1/tenants/{name}").json()
    assert tenant["quota"] == {"cpu": {"used": 0, "cap": 8}, "gpu": {"used": 0, "cap": 2}}
    pool = api.admin.get("/v1/pools/shared").json()
    assert pool["capacity"]["gpu"]["cap"] == 1000
    usage = api.admin.get("/v1/usage").json()
    assert {"tenant": name, "resource": "gpu", "used": 0, "cap": 2,
            "nominal": 2, "cohort": None, "borrowed": 0, "lent": 0} in usage["tenants"]
    assert any(row["pool"] == "shared" for row in usage["pools"])
    missing = api.admin.get("/v1/tenants/no-such-tenant")
    assert missing.status_code == 404
    assert missing.json()["code"] == "unknown_tenant"


def test_submit_is_idempotent_and_a_changed_replay_conflicts(api: Api) -> None:
    name, client = api.tenant()
    request_id = new_id()
    body = {"id": request_id, "cost": {"gpu": 1}, "priority": 3, "payload": {"image": "x"}}
    first = client.post(f"/v1/tenants/{name}/requests", json=body)
    assert first.status_code == 202, first.text
    assert first.json()["id"] == request_id
    again = client.post(f"/v1/tenants/{name}/requests", json=body)
    assert again.status_code == 200
    assert again.json()["created"] == first.json()["created"]
    changed = client.post(f"/v1/tenants/{name}/requests", json={**body, "priority": 4})
    assert changed.status_code == 409
    assert changed.json()["code"] == "request_conflict"
    listed = client.get(f"/v1/tenants/{name}/requests").json()["requests"]
    assert [item["id"] for item in listed] == [request_id]
    assert listed[0]["priority"] == 3


def test_a_request_is_admitted_shown_with_its_pool_and_released(api: Api) -> None:
    name, client = api.tenant({"gpu": 2})
    request_id = new_id()
    assert client.post(f"/v1/tenants/{name}/requests",
                       json={"id": request_id, "cost": {"gpu": 2}}).status_code == 202
    path = f"/v1/tenants/{name}/requests/{request_id}"
    shown = wait_for_state(client, path, {"reserved", "delivered"})
    assert shown["pool"] == "shared"
    assert shown["queue"] is None
    assert "binding" in shown
    # Charged work ends on its executor's (or an admin's) word, not its tenant's.
    refused = client.post(f"{path}/complete")
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "executor_only"
    # The server has no target: its worker's attempts fail. Between two, the admin's
    # complete ends it at once; while one is under way it is a stop first (202), which
    # the worker confirms (nothing was created) before the cost comes back
    # (docs/decisions/819, 821).
    done = api.admin.post(f"{path}/complete")
    assert done.status_code in (200, 202), done.text
    if done.status_code == 200:
        assert done.json()["state"] == "completed" and done.json()["released"] == {"gpu": 2}
    else:
        assert done.json()["state"] == "completing" and done.json()["released"] == {}
        wait_for_state(api.admin, path, {"completed"})
    again = api.admin.post(f"{path}/complete")
    assert again.status_code == 200 and again.json()["released"] == {}
    quota = api.admin.get(f"/v1/tenants/{name}").json()["quota"]
    assert quota["gpu"] == {"used": 0, "cap": 2}


def test_a_waiting_request_shows_its_queue_position_and_what_blocks_it(api: Api) -> None:
    name, client = api.tenant({"gpu": 1})
    first, second = new_id(), new_id()
    client.post(f"/v1/tenants/{name}/requests", json={"id": first, "cost": {"gpu": 1}})
    wait_for_state(client, f"/v1/tenants/{name}/requests/{first}", {"reserved", "delivered"})
    client.post(f"/v1/tenants/{name}/requests", json={"id": second, "cost": {"gpu": 1}})
    shown = client.get(f"/v1/tenants/{name}/requests/{second}").json()
    assert shown["state"] == "waiting"
    assert shown["queue"]["tenant_position"] == 1
    assert shown["queue"]["position"] >= 1
    assert shown["queue"]["tenant_blocked_by"] == [
        {"resource": "gpu", "need": 1, "used": 1, "cap": 1}
    ]
    cancelled = client.post(f"/v1/tenants/{name}/requests/{second}/cancel")
    assert cancelled.json()["state"] == "cancelled"
    failed = api.admin.post(f"/v1/tenants/{name}/requests/{first}/fail", json={"reason": "oom"})
    assert failed.json()["state"] in ("failed", "failing")  # failing: a stop first (819)
    assert failed.json()["reason"] == "oom"
    ended = wait_for_state(api.admin, f"/v1/tenants/{name}/requests/{first}", {"failed"})
    assert ended["reason"] == "oom"


def test_listing_pages_with_a_cursor_and_filters_by_state(api: Api) -> None:
    name, client = api.stalled_tenant()  # nothing is admitted: all stay waiting
    ids = [new_id() for _ in range(5)]
    for request_id in ids:
        assert client.post(f"/v1/tenants/{name}/requests",
                           json={"id": request_id, "cost": {"gpu": 1}}).status_code == 202
    client.post(f"/v1/tenants/{name}/requests/{ids[0]}/cancel")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"/v1/tenants/{name}/requests", params=params).json()
        seen += [item["id"] for item in page["requests"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(set(seen))
    waiting = client.get(f"/v1/tenants/{name}/requests", params={"state": "waiting"}).json()
    assert sorted(item["id"] for item in waiting["requests"]) == sorted(ids[1:])
    bad = client.get(f"/v1/tenants/{name}/requests", params={"cursor": "not-a-cursor"})
    assert bad.status_code == 400
    assert bad.json()["code"] == "invalid_cursor"
    bad_state = client.get(f"/v1/tenants/{name}/requests", params={"state": "sleeping"})
    assert bad_state.status_code == 422
    assert bad_state.json()["code"] == "invalid_input"


def test_a_tenant_token_cannot_see_or_touch_another_tenant(api: Api) -> None:
    mine, me = api.stalled_tenant()
    theirs, them = api.stalled_tenant()
    their_id = new_id()
    assert them.post(f"/v1/tenants/{theirs}/requests",
                     json={"id": their_id, "cost": {"gpu": 1}}).status_code == 202

    read = me.get(f"/v1/tenants/{theirs}/requests/{their_id}")
    never_existed = me.get(f"/v1/tenants/{theirs}/requests/{new_id()}")
    assert read.status_code == never_existed.status_code == 404
    assert read.json()["code"] == never_existed.json()["code"] == "unknown_request"
    # The path names my tenant but the id is theirs: still not found.
    assert me.get(f"/v1/tenants/{mine}/requests/{their_id}").status_code == 404

    for verb in ("cancel", "complete", "fail"):
        refused = me.post(f"/v1/tenants/{theirs}/requests/{their_id}/{verb}")
        assert refused.status_code == 404, verb
        assert me.post(f"/v1/tenants/{mine}/requests/{their_id}/{verb}").status_code == 404
    assert them.get(f"/v1/tenants/{theirs}/requests/{their_id}").json()["state"] == "waiting"

    submit = me.post(f"/v1/tenants/{theirs}/requests", json={"id": new_id(), "cost": {"gpu": 1}})
    assert submit.status_code == 403
    assert submit.json()["code"] == "forbidden"
    assert me.get(f"/v1/tenants/{theirs}/requests").status_code == 403
    assert me.get(f"/v1/tenants/{theirs}").status_code == 403
    assert me.get(f"/v1/tenants/{mine}").status_code == 200
    assert me.put(f"/v1/tenants/{mine}", json={"quota": {"gpu": 100}}).status_code == 403
    assert me.put("/v1/pools/shared", json={"capacity": {"gpu": 1}}).status_code == 403
    assert me.get("/v1/pools/shared").status_code == 403
    assert me.get("/v1/audit", params={"tenant": theirs}).status_code == 403

    # Ids are global: reusing theirs is a conflict that says nothing about them.
    taken = me.post(f"/v1/tenants/{mine}/requests", json={"id": their_id, "cost": {"gpu": 1}})
    assert taken.status_code == 409
    assert taken.json()["code"] == "request_id_taken"
    assert theirs not in taken.text
    assert '"gpu"' not in taken.text

    usage = me.get("/v1/usage").json()
    assert {row["tenant"] for row in usage["tenants"]} == {mine}
    entries = me.get("/v1/audit").json()["entries"]
    refusals = {(entry["operation"], entry["target"]) for entry in entries
                if entry["outcome"] == "refused"}
    # My refused attempts are in my own audit log, each naming what it aimed at.
    assert ("request.submit", f"tenant/{theirs}") in refusals, entries
    assert ("request.list", f"tenant/{theirs}") in refusals, entries
    assert "pool.set" in {operation for operation, _ in refusals}, entries
    assert {entry["tenant"] for entry in entries} == {mine}
    assert all(their_id not in (entry["target"] or "") or entry["outcome"] == "refused"
               for entry in entries)
    # One request's entries (?request=), scoped as the rest of /v1/audit: their request's
    # story is theirs (and an admin's); my refusals that named it are not part of it.
    assert me.get("/v1/audit", params={"request": their_id}).json()["entries"] == []
    story = them.get("/v1/audit", params={"request": their_id}).json()["entries"]
    assert [(entry["operation"], entry["tenant"], entry["target"]) for entry in story] == [
        ("submit", theirs, their_id)], story
    assert api.admin.get("/v1/audit", params={"request": their_id}).json()["entries"] == story
    bad = api.admin.get("/v1/audit", params={"request": "not an id"})
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_request_id")


def test_missing_wrong_and_revoked_tokens_are_refused(api: Api) -> None:
    name, _ = api.tenant()
    with Quotagate.connect(api.db_url) as gate:
        from quotagate.auth.tokens import TokenStore

        created = TokenStore(gate.engine).create(tenant=name, actor="test")
    client = api.client(created.token)
    assert client.get(f"/v1/tenants/{name}/requests").status_code == 200
    with Quotagate.connect(api.db_url) as gate:
        TokenStore(gate.engine).revoke(created.info.id, actor="test")
    revoked = client.get(f"/v1/tenants/{name}/requests")
    assert revoked.status_code == 401
    assert revoked.json()["code"] == "invalid_token"
    assert revoked.headers["WWW-Authenticate"] == "Bearer"
    url = f"{api.server.url}/v1/tenants/{name}/requests"
    assert httpx.get(url).json()["code"] == "missing_token"
    forged = created.token[:-4] + "AAAA"
    wrong = httpx.get(url, headers=bearer(forged))
    assert wrong.status_code == 401
    assert wrong.json() == revoked.json()
    assert httpx.get(url, headers=bearer("nonsense")).status_code == 401


def test_error_bodies_have_a_code_and_a_message(api: Api) -> None:
    name, client = api.tenant()
    path = f"/v1/tenants/{name}/requests"
    cases = [
        (client.post(path, content=b"{", headers={"content-type": "application/json"}), 422),
        (client.post(path, json={"id": new_id(), "cost": {"gpu": 0}}), 400),
        (client.post(path, json={"id": new_id(), "cost": {"gpu": True}}), 422),
        (client.post(path, json={"id": "bad id!", "cost": {"gpu": 1}}), 400),
        (client.post(path, json={"id": new_id(), "cost": {"unobtainium": 1}}), 400),
        (client.post(path, json={"id": new_id(), "cost": {"gpu": 1}, "extra": 1}), 422),
        (client.get("/v1/nowhere"), 404),
        (client.delete(path), 405),
        (client.post(path, content=b"x" * (1024 * 1024 + 1),
                     headers={"content-type": "application/json"}), 413),
    ]
    for response, status in cases:
        assert response.status_code == status, (response.request.url, response.text)
        body = response.json()
        assert isinstance(body["code"], str) and body["code"]
        assert isinstance(body["message"], str) and body["message"]
    assert cases[-1][0].json()["code"] == "body_too_large"
    assert client.get(path).json()["requests"] == [], "bad input changed nothing"


def test_an_exhausted_rate_quota_answers_429_with_retry_after(api: Api) -> None:
    name, client = api.tenant()
    with Quotagate.connect(api.db_url) as gate:
        gate.set_rate(name, "capacity=1,refill=0.01", actor="test")
    path = f"/v1/tenants/{name}/requests"
    assert client.post(path, json={"id": new_id(), "cost": {"gpu": 1}}).status_code == 202
    refused_id = new_id()
    refused = client.post(path, json={"id": refused_id, "cost": {"gpu": 1}})
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "rate_quota_exhausted"
    assert 1 <= int(refused.headers["Retry-After"]) <= 101
    assert refused.headers["RateLimit-Limit"] == "1"
    assert refused.headers["RateLimit-Remaining"] == "0"
    shown = client.get(f"{path}/{refused_id}").json()
    assert shown["state"] == "rejected", "refused work leaves a visible trace"
    text = httpx.get(f"{api.server.url}/metrics").text
    assert f'quotagate_rejections_total{{code="rate_quota_exhausted",tenant="{name}"}} 1.0' in text


def test_audit_log_records_who_did_what(api: Api) -> None:
    name, client = api.tenant()
    request_id = new_id()
    client.post(f"/v1/tenants/{name}/requests", json={"id": request_id, "cost": {"gpu": 1}})
    wait_for_state(client, f"/v1/tenants/{name}/requests/{request_id}", {"reserved", "delivered"})
    entries = api.admin.get("/v1/audit", params={"tenant": name, "limit": 500}).json()["entries"]
    operations = {(entry["operation"], entry["target"]) for entry in entries}
    assert ("submit", request_id) in operations
    assert ("admit", request_id) in operations
    assert ("tenant.set", f"tenant/{name}") in operations
    submit = next(entry for entry in entries if entry["operation"] == "submit")
    assert submit["actor"].startswith("token:")
    everything = api.admin.get("/v1/audit", params={"limit": 1})
    assert everything.json()["next_cursor"]
    older = api.admin.get("/v1/audit",
                          params={"limit": 1, "cursor": everything.json()["next_cursor"]})
    assert older.json()["entries"][0]["id"] < everything.json()["entries"][0]["id"]


def test_metrics_carry_tenant_and_pool_labels(api: Api) -> None:
    name, client = api.tenant({"gpu": 3})
    request_id = new_id()
    client.post(f"/v1/tenants/{name}/requests", json={"id": request_id, "cost": {"gpu": 2}})
    wait_for_state(client, f"/v1/tenants/{name}/requests/{request_id}", {"reserved", "delivered"})
    # The admission wait is observed beside the admission loop, just after it.
    waited = f'quotagate_admission_wait_seconds_count{{tenant="{name}"}} 1.0'

    def observed() -> str | None:
        text = httpx.get(f"{api.server.url}/metrics").text
        return text if waited in text else None

    text = wait_for(observed, "the admission wait observed")
    assert f'quotagate_tenant_used{{resource="gpu",tenant="{name}"}} 2.0' in text
    assert f'quotagate_tenant_cap{{resource="gpu",tenant="{name}"}} 3.0' in text
    assert 'quotagate_pool_cap{pool="shared",resource="gpu"} 1000.0' in text
    assert f'quotagate_admissions_total{{pool="shared",tenant="{name}"}} 1.0' in text
    assert f'quotagate_submissions_total{{outcome="created",tenant="{name}"}} 1.0' in text
    assert "quotagate_store_up 1.0" in text


def test_openapi_describes_the_v1_api(api: Api) -> None:
    schema = httpx.get(f"{api.server.url}/openapi.json").json()
    paths = set(schema["paths"])
    assert {
        "/v1/tenants/{tenant}", "/v1/pools/{pool}", "/v1/usage",
        "/v1/tenants/{tenant}/requests", "/v1/tenants/{tenant}/requests/{request_id}",
        "/v1/tenants/{tenant}/requests/{request_id}/cancel",
        "/v1/tenants/{tenant}/requests/{request_id}/complete",
        "/v1/tenants/{tenant}/requests/{request_id}/fail",
        "/v1/audit", "/healthz", "/readyz", "/metrics",
    } <= paths


def test_a_token_made_with_the_cli_works_until_revoked_with_the_cli(
    api: Api, tmp_path: Path
) -> None:
    import subprocess

    from support.http_servers import QUOTAGATE

    name, _ = api.tenant()
    created = subprocess.run(
        [QUOTAGATE, "api-token", "create", "--tenant", name, "--label", "ci", "--db", api.db_url],
        capture_output=True, text=True, check=True,
    )
    token = created.stdout.strip()
    client = api.client(token)
    assert client.get(f"/v1/tenants/{name}/requests").status_code == 200
    listing = subprocess.run([QUOTAGATE, "api-token", "list", "--db", api.db_url],
                             capture_output=True, text=True, check=True).stdout
    token_id = token.split("_")[1]
    assert token_id in listing
    assert token.split("_", 2)[2] not in listing, "secrets are never listed"
    subprocess.run([QUOTAGATE, "api-token", "revoke", token_id, "--db", api.db_url], check=True,
                   capture_output=True)
    assert client.get(f"/v1/tenants/{name}/requests").status_code == 401
    audit = subprocess.run([QUOTAGATE, "audit", "--tenant", name, "--db", api.db_url],
                           capture_output=True, text=True, check=True).stdout
    assert "token.revoke" in audit and "token.create" in audit
