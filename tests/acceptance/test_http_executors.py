"""Who may end running work, over HTTP, on every SQL backend.

Requests are delivered for real (the dispatcher, a webhook receiver on
127.0.0.1); the API is the real application on the real database, driven
served by uvicorn in a thread, over HTTP. See docs/decisions/310-executor-tokens-and-callbacks.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from quotagate import Quotagate, RequestState
from quotagate.auth.tokens import TokenStore, hash_secret, parse_token
from quotagate.delivery.registry import TargetStore
from quotagate.errors import NotFound
from quotagate.http import create_app
from quotagate.store import schema
from support import cli
from support.executors import deliver, webhook_receiver, webhook_target
from support.http_servers import serving
from support.ledger_state import count, snapshot


@dataclass
class Platform:
    gate: Quotagate
    http: httpx.Client
    tenant: dict[str, str]     # Authorization headers of a team-a token
    executor_a: dict[str, str]  # of an executor token for target hooks-a
    admin: dict[str, str]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def platform(db_url: str) -> Iterator[Platform]:
    with Quotagate.connect(db_url) as gate, webhook_receiver() as receiver:
        gate.set_pool("main", {"gpu": 8})
        gate.set_tenant("team-a", {"gpu": 4})
        webhook_target(gate, "hooks-a", receiver, default=True)
        webhook_target(gate, "hooks-b", receiver)
        tokens = TokenStore(gate.engine)
        with serving(create_app(gate)) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield Platform(
                gate, http,
                tenant=_bearer(tokens.create(tenant="team-a").token),
                executor_a=_bearer(tokens.create(executor_target="hooks-a").token),
                admin=_bearer(tokens.create(admin=True).token),
            )


def _path(request_id: str, verb: str) -> str:
    return f"/v1/tenants/team-a/requests/{request_id}/{verb}"


def _used(gate: Quotagate) -> int:
    return next(row["used"] for row in gate.usage()["tenants"]
                if row["tenant"] == "team-a" and row["resource"] == "gpu")


def test_a_tenant_token_may_not_complete_or_fail_delivered_work_but_may_cancel_it(
    platform: Platform,
) -> None:
    gate, http = platform.gate, platform.http
    deliver(gate, "job-1", "team-a", "hooks-a")
    before = snapshot(gate)
    for verb in ("complete", "fail"):
        answer = http.post(_path("job-1", verb), headers=platform.tenant, json={"reason": "done"})
        assert answer.status_code == 403, answer.text
        assert answer.json()["code"] == "executor_only"
        assert "cancel" in answer.json()["message"]
    assert snapshot(gate) == before  # the cost stays charged, the request delivered
    assert gate.show("job-1").state == RequestState.DELIVERED
    cancelled = http.post(_path("job-1", "cancel"), headers=platform.tenant)
    assert cancelled.status_code == 200, cancelled.text
    # A stop: cancelled at once, or cancelling until the executor confirms.
    assert cancelled.json()["state"] in ("cancelled", "cancelling")


def test_a_tenant_token_may_not_end_reserved_work_either(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    gate.submit("job-r", "team-a", {"gpu": 1})
    assert gate.admit(1)
    answer = http.post(_path("job-r", "complete"), headers=platform.tenant)
    assert answer.status_code == 403, answer.text
    assert gate.show("job-r").state == RequestState.RESERVED
    assert _used(gate) == 1


def test_an_admin_may_still_end_delivered_work_by_a_stop_or_by_force(platform: Platform) -> None:
    deliver(platform.gate, "job-2", "team-a", "hooks-a")
    answer = platform.http.post(_path("job-2", "fail"), headers=platform.admin,
                                json={"reason": "operator"})
    assert answer.status_code == 202, answer.text  # it may run: a stop first (819)
    assert answer.json()["state"] == "failing" and answer.json()["released"] == {}
    assert _used(platform.gate) == 1
    # This receiver never confirms a stop: the admin forces the end (820).
    answer = platform.http.post(_path("job-2", "fail"), headers=platform.admin,
                                json={"reason": "operator", "force": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["released"] == {"gpu": 1}


def test_an_executor_token_ends_work_delivered_to_its_target_once(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    token = deliver(gate, "job-3", "team-a", "hooks-a", {"gpu": 2})
    assert _used(gate) == 2
    answer = http.post(_path("job-3", "complete"), headers=platform.executor_a,
                       json={"fencing_token": token, "reason": "exit 0"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "completed"
    assert answer.json()["released"] == {"gpu": 2}
    assert _used(gate) == 0
    again = http.post(_path("job-3", "complete"), headers=platform.executor_a,
                      json={"fencing_token": token})
    assert again.status_code == 200, again.text
    assert again.json()["released"] == {}  # the cost came back once
    assert _used(gate) == 0
    entry = http.get("/v1/audit?tenant=team-a", headers=platform.admin).json()["entries"]
    executor_id = platform.executor_a["Authorization"].split("_")[1]
    assert any(e["operation"] == "completed" and e["actor"] == f"token:{executor_id}"
               and e["target"] == "job-3" for e in entry)


def test_an_executor_token_is_refused_for_another_targets_request(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    token = deliver(gate, "job-b", "team-a", "hooks-b")
    before = snapshot(gate)
    for verb in ("complete", "fail"):
        answer = http.post(_path("job-b", verb), headers=platform.executor_a,
                           json={"fencing_token": token})
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "unknown_request"
    assert snapshot(gate) == before
    assert gate.show("job-b").state == RequestState.DELIVERED


def test_a_callback_with_a_stale_or_missing_fencing_token_is_refused(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    token = deliver(gate, "job-s", "team-a", "hooks-a")
    before = snapshot(gate)
    stale = http.post(_path("job-s", "complete"), headers=platform.executor_a,
                      json={"fencing_token": token - 1})
    assert stale.status_code == 409, stale.text
    assert stale.json()["code"] == "stale_fencing_token"
    future = http.post(_path("job-s", "complete"), headers=platform.executor_a,
                       json={"fencing_token": token + 1})
    assert future.status_code == 409, future.text
    missing = http.post(_path("job-s", "fail"), headers=platform.executor_a)
    assert missing.status_code == 409, missing.text
    assert missing.json()["code"] == "fencing_token_required"
    assert snapshot(gate) == before


def test_a_stale_token_and_one_no_delivery_carried_are_told_apart_and_quoted_short(
    platform: Platform,
) -> None:
    gate, http = platform.gate, platform.http
    token = deliver(gate, "job-w", "team-a", "hooks-a")
    before = snapshot(gate)
    messages = {}
    for sent in (token - 1, token + 1, 10**300):
        answer = http.post(_path("job-w", "complete"), headers=platform.executor_a,
                           json={"fencing_token": sent})
        assert (answer.status_code, answer.json()["code"]) == (409, "stale_fencing_token")
        messages[sent] = answer.json()["message"]
    assert messages[token - 1].endswith("a newer attempt owns it"), messages
    # Above every claim is no older attempt's: "a newer attempt owns it" would send the
    # executor looking for a successor that does not exist.
    assert "was never given to a delivery of request 'job-w'" in messages[token + 1], messages
    assert "… (301 characters)" in messages[10**300] and len(messages[10**300]) < 300, messages
    assert snapshot(gate) == before


def test_a_callback_before_the_delivery_is_recorded_is_told_to_call_again(
    platform: Platform,
) -> None:
    gate, http = platform.gate, platform.http
    gate.submit("job-early", "team-a", {"gpu": 1})
    assert gate.admit(1)
    before = snapshot(gate)
    answer = http.post(_path("job-early", "complete"), headers=platform.executor_a,
                       json={"fencing_token": 1})
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "not_delivered"
    assert snapshot(gate) == before


def test_an_executor_token_can_do_nothing_else(platform: Platform) -> None:
    gate, http = platform.gate, platform.http
    token = deliver(gate, "job-x", "team-a", "hooks-a")
    before = snapshot(gate)
    executor = platform.executor_a
    refused = {
        ("GET", "/v1/tenants/team-a/requests/job-x"): 404,
        ("GET", "/v1/tenants/team-a/requests"): 403,
        ("POST", "/v1/tenants/team-a/requests/job-x/cancel"): 404,
        ("GET", "/v1/tenants/team-a"): 403,
        ("PUT", "/v1/tenants/team-a"): 403,
        ("PUT", "/v1/pools/main"): 403,
        ("GET", "/v1/pools/main"): 403,
        ("GET", "/v1/usage"): 403,
        ("GET", "/v1/audit"): 403,
        ("GET", "/v1/tenants/team-a/rate"): 403,
    }
    for (method, path), status in refused.items():
        body = {"capacity" if "pools" in path else "quota": {"gpu": 9}} if method == "PUT" else None
        answer = http.request(method, path, headers=executor, json=body)
        assert answer.status_code == status, (method, path, answer.text)
    for path in ("/v1/tenants/team-a/requests", "/v1/tenants/team-a/requests:batch"):
        body = {"id": "job-y", "cost": {"gpu": 1}}
        answer = http.post(path, headers=executor,
                           json={"requests": [body]} if path.endswith("batch") else body)
        assert answer.status_code == 403, (path, answer.text)
    assert snapshot(gate) == before
    with pytest.raises(NotFound):
        gate.show("job-y")
    assert gate.show("job-x").state == RequestState.DELIVERED
    # …and what it may do still works.
    ended = http.post(_path("job-x", "complete"), headers=executor,
                      json={"fencing_token": token})
    assert ended.status_code == 200, ended.text


def test_executor_tokens_are_stored_hashed_and_need_an_existing_target(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        tokens = TokenStore(gate.engine)
        with pytest.raises(NotFound) as missing:
            tokens.create(executor_target="no-such-target")
        assert missing.value.code == "unknown_target"
        assert count(gate, schema.api_token) == 0
        with webhook_receiver() as receiver:
            webhook_target(gate, "hooks-a", receiver)
        created = tokens.create(executor_target="hooks-a", label="receiver")
        assert created.info.scope == "executor=hooks-a"
        secret = parse_token(created.token)[1]
        with gate.engine.connect() as connection:
            stored = connection.execute(sa.select(schema.api_token)).mappings().one()
        assert stored["secret_hash"] == hash_secret(secret)
        assert secret not in str(dict(stored))
        actor = tokens.authenticate(created.token)
        assert actor.executor_target == "hooks-a" and not actor.admin and actor.tenant is None


def test_cli_creates_and_lists_executor_tokens(db_url: str, tmp_path: Path) -> None:
    with Quotagate.connect(db_url) as gate:
        TargetStore(gate.engine).set("hooks-a", "webhook", {"url": "http://127.0.0.1:9/hooks"})
    created = cli.run("api-token", "create", "--executor", "--target", "hooks-a",
                      db=db_url, cwd=tmp_path)
    token = created.stdout.strip()
    assert "executor hooks-a" in created.stderr
    listed = cli.run("api-token", "list", db=db_url, cwd=tmp_path)
    assert "executor=hooks-a" in listed.stdout
    assert parse_token(token)[1] not in listed.stdout
    with Quotagate.connect(db_url) as gate:
        assert TokenStore(gate.engine).authenticate(token).executor_target == "hooks-a"
    missing = cli.run("api-token", "create", "--executor", "--target", "no-such",
                      db=db_url, cwd=tmp_path, expect=4)
    assert "unknown_target" in missing.stderr
    alone = cli.run("api-token", "create", "--executor", db=db_url, cwd=tmp_path, expect=2)
    assert "invalid_token_scope" in alone.stderr
    with Quotagate.connect(db_url) as gate:
        assert count(gate, schema.api_token) == 1


def test_a_batch_of_ends_answers_each_as_its_single_call_would(platform: Platform) -> None:
    """POST …/requests:end (docs/decisions/223): one call, one transaction, each end judged."""
    gate, http = platform.gate, platform.http
    first = deliver(gate, "job-e1", "team-a", "hooks-a", {"gpu": 2})
    second = deliver(gate, "job-e2", "team-a", "hooks-a")
    other = deliver(gate, "job-eb", "team-a", "hooks-b")
    assert _used(gate) == 4
    ends = [
        {"id": "job-e1", "state": "completed", "fencing_token": first},
        {"id": "job-e2", "state": "failed", "reason": "oom", "fencing_token": second - 1},
        {"id": "job-eb", "state": "completed", "fencing_token": other},  # another target's
        {"id": "job-e1", "state": "completed", "fencing_token": first},  # again: no-op
        {"id": "job-e2", "state": "failed", "reason": "oom", "fencing_token": second},
        {"id": "bad id!", "state": "completed", "fencing_token": 1},
    ]
    answer = http.post("/v1/tenants/team-a/requests:end", headers=platform.executor_a,
                       json={"ends": ends})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [result["status"] for result in results] == [200, 409, 404, 200, 200, 400]
    assert results[0]["released"] == {"gpu": 2} and results[0]["request"]["state"] == "completed"
    assert results[1]["error"]["code"] == "stale_fencing_token"
    assert results[2]["error"]["code"] == "unknown_request"
    assert results[3]["released"] == {}  # the cost came back once
    assert results[4]["released"] == {"gpu": 1} and results[4]["request"]["reason"] == "oom"
    assert _used(gate) == 1  # job-eb, another target's, still charged
    assert gate.show("job-eb").state == RequestState.DELIVERED

    # A tenant token is refused per entry, as for its single calls; nothing changes.
    before = snapshot(gate)
    refused = http.post("/v1/tenants/team-a/requests:end", headers=platform.tenant,
                        json={"ends": [{"id": "job-eb", "state": "completed"}]})
    assert refused.status_code == 200, refused.text
    assert refused.json()["results"][0]["status"] == 403
    assert snapshot(gate) == before
    too_many = http.post("/v1/tenants/team-a/requests:end", headers=platform.executor_a,
                         json={"ends": [{"id": "job-eb", "state": "completed"}] * 1001})
    assert too_many.status_code == 413, too_many.text
    assert snapshot(gate) == before
