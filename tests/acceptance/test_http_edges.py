"""Hostile inputs over HTTP through a real `quotagate serve`: a clear 4xx, nothing written.

One server per backend for the module; the ledger-level cases are in
tests/integration/test_bad_input_edges.py.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.store import schema
from support.databases import BACKENDS, fresh_database
from support.http_servers import bearer, make_token, put_stalled_tenant, running_server, start_server
from support.redis_servers import RedisServer


@dataclass
class Api:
    db_url: str
    admin: httpx.Client
    tenant: str


@pytest.fixture(
    scope="module",
    params=[pytest.param(name, marks=getattr(pytest.mark, name)) for name in BACKENDS],
)
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp_path: Path = tmp_path_factory.mktemp(f"edges-{request.param}")
    with fresh_database(str(request.param), tmp_path) as db_url:
        token = make_token(db_url)
        with running_server(db_url, tmp_path) as server, httpx.Client(
            base_url=server.url, headers=bearer(token), timeout=30
        ) as admin:
            assert admin.put("/v1/pools/main", json={"capacity": {"gpu": 100}}).status_code == 200
            assert admin.put("/v1/tenants/team-a", json={"quota": {"gpu": 50}}).status_code == 200
            yield Api(db_url, admin, "team-a")


def _listing(api: Api) -> list[str]:
    response = api.admin.get(f"/v1/tenants/{api.tenant}/requests", params={"limit": 500})
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["requests"]]


def _raw_submit(api: Api, body: bytes) -> httpx.Response:
    return api.admin.post(f"/v1/tenants/{api.tenant}/requests", content=body,
                          headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("payload", [b'"\\ud800"', b'{"a":"x\\udfffy"}', b'{"\\udc00":1}'])
def test_a_lone_surrogate_payload_is_400_and_stored_nowhere(api: Api, payload: bytes) -> None:
    request_id = f"s-{uuid.uuid4().hex[:10]}"
    answer = _raw_submit(api, b'{"id":"%s","cost":{"gpu":1},"payload":%s}'
                         % (request_id.encode(), payload))
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_payload"
    assert api.admin.get(f"/v1/tenants/{api.tenant}/requests/{request_id}").status_code == 404
    assert request_id not in _listing(api)


@pytest.mark.parametrize(("body", "says"), [
    (b'{"id":"%s","cost":{"gpu":1},"payload":' + b"[" * 3000 + b"]" * 3000 + b"}", "too deeply"),
    (b'{"id":"%s","cost":{"gpu":' + b"9" * 5000 + b"}}", "number too long"),
    (b'{"id":"%s","cost":{"gpu":1},"payload":"\xff"}', "not UTF-8"),
])
def test_a_body_the_parser_cannot_read_is_422_with_a_sentence(
    api: Api, body: bytes, says: str
) -> None:
    # FastAPI answered these with a bare 400 "There was an error parsing the body".
    request_id = f"p-{uuid.uuid4().hex[:10]}"
    answer = _raw_submit(api, body.replace(b"%s", request_id.encode()))
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_input"
    assert says in answer.json()["message"]
    assert request_id not in _listing(api)


@pytest.mark.parametrize("path", ["/v1/tenants/team-a/requests:batch",
                                  "/v1/tenants/team-a/requests:end",
                                  "/v1/tenants/team-a/topics/t/messages"])
def test_every_body_nested_past_the_parser_is_422(api: Api, path: str) -> None:
    answer = api.admin.post(path, content=b"[" * 3000 + b"]" * 3000,
                            headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_input"


def test_a_payload_nested_past_the_limit_is_400_and_one_at_it_is_accepted(api: Api) -> None:
    from quotagate.domain.model import MAX_PAYLOAD_DEPTH

    deep, at_limit = f"d-{uuid.uuid4().hex[:10]}", f"d-{uuid.uuid4().hex[:10]}"
    levels = MAX_PAYLOAD_DEPTH + 1
    answer = _raw_submit(api, b'{"id":"%s","cost":{"gpu":1},"payload":%s}'
                         % (deep.encode(), b"[" * levels + b"]" * levels))
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_payload"
    assert str(MAX_PAYLOAD_DEPTH) in answer.json()["message"]
    assert deep not in _listing(api)
    levels = MAX_PAYLOAD_DEPTH
    answer = _raw_submit(api, b'{"id":"%s","cost":{"gpu":1},"payload":%s}'
                         % (at_limit.encode(), b'{"a":' * levels + b"1" + b"}" * levels))
    assert answer.status_code == 202, answer.text


@pytest.mark.parametrize("body", [{"quota": {"gpu": 50}, "budget": {"gpu": "9" * 100_000}},
                                  {"quota": {"gpu": 50}, "reclaim": "x" * 100_000}])
def test_a_refusal_quotes_at_most_80_characters_of_a_huge_value(
    api: Api, body: dict[str, Any]
) -> None:
    answer = api.admin.put(f"/v1/tenants/{api.tenant}", json=body)
    assert answer.status_code == 400, answer.text[:300]
    message = answer.json()["message"]
    assert message.endswith("… (100000 characters)"), message[:300]
    assert len(message) < 300, message[:300]


@pytest.mark.parametrize(("method", "path", "body"), [
    ("PUT", "/v1/tenants/team-a", {"quota": {"gpu": 10**400}}),
    ("PUT", "/v1/pools/main", {"capacity": {"gpu": 10**400}}),
    ("POST", "/v1/tenants/team-a/requests", {"id": "huge-cost", "cost": {"gpu": 10**400}}),
])
def test_a_huge_amount_is_quoted_at_most_80_characters(
    api: Api, method: str, path: str, body: dict[str, Any]
) -> None:
    before = api.admin.get("/v1/usage").json()
    answer = api.admin.request(method, path, json=body)
    assert answer.status_code == 400, answer.text[:300]
    message = answer.json()["message"]
    assert message.endswith("… (401 characters)"), message[:500]
    assert api.admin.get("/v1/usage").json() == before and "huge-cost" not in _listing(api)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_json_body_sent_without_the_json_content_type_is_told_to_send_it(
    api: Api, content_type: str | None
) -> None:
    # `curl -d '{...}'` (no -H) sends a form: FastAPI answered "body: Input should be a
    # valid dictionary or object to extract fields from", which names no cause.
    request_id = f"t-{uuid.uuid4().hex[:10]}"
    headers = {"Content-Type": content_type} if content_type else {}
    answer = api.admin.post(f"/v1/tenants/{api.tenant}/requests", headers=headers,
                            content=json.dumps({"id": request_id, "cost": {"gpu": 1}}).encode())
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_input"
    message = answer.json()["message"]
    assert "send the body as JSON with 'Content-Type: application/json'" in message, message
    assert (repr(content_type) if content_type else "without a Content-Type") in message
    assert request_id not in _listing(api)


def test_a_cost_above_the_quota_is_400_with_resource_cost_and_limit(api: Api) -> None:
    request_id = f"c-{uuid.uuid4().hex[:10]}"
    answer = api.admin.post(f"/v1/tenants/{api.tenant}/requests",
                            json={"id": request_id, "cost": {"gpu": 51}})
    assert answer.status_code == 400, answer.text
    assert answer.json() == {
        "code": "cost_above_quota", "resource": "gpu", "needed": 51, "limit": 50,
        "message": "cost gpu=51 is more than tenant 'team-a' can ever hold: its quota allows "
                   "gpu=50; nothing was submitted"}
    dry = api.admin.post(f"/v1/tenants/{api.tenant}/requests", params={"dry_run": "true"},
                         json={"id": request_id, "cost": {"gpu": 51}})
    assert (dry.status_code, dry.json()["code"]) == (400, "cost_above_quota")
    assert request_id not in _listing(api)


def test_an_astral_character_payload_round_trips(api: Api) -> None:
    request_id = f"s-{uuid.uuid4().hex[:10]}"
    answer = _raw_submit(api, b'{"id":"%s","cost":{"gpu":1},"payload":"\\ud83d\\ude00"}'
                         % request_id.encode())
    assert answer.status_code == 202, answer.text
    assert answer.json()["payload"] == "\U0001f600"


@pytest.mark.parametrize("suffix", ["%0A", "%0D%0A"])
def test_a_request_id_or_tenant_ending_in_a_newline_is_400(api: Api, suffix: str) -> None:
    request_id = f"n-{uuid.uuid4().hex[:10]}"
    body = json.dumps({"id": f"{request_id}\n", "cost": {"gpu": 1}})
    by_body = _raw_submit(api, body.encode())
    assert by_body.status_code == 400, by_body.text
    assert by_body.json()["code"] == "invalid_request_id"
    by_path = api.admin.post(f"/v1/tenants/team-a{suffix}/requests",
                             json={"id": request_id, "cost": {"gpu": 1}})
    assert by_path.status_code in (400, 404), by_path.text
    assert by_path.json()["code"] in ("invalid_tenant_name", "unknown_tenant")
    tenant = api.admin.put(f"/v1/tenants/team-z{suffix}", json={"quota": {"gpu": 1}})
    assert tenant.status_code == 400, tenant.text
    assert tenant.json()["code"] == "invalid_tenant_name"
    assert api.admin.get("/v1/tenants/team-z").status_code == 404
    assert request_id not in _listing(api)


def test_a_differently_cased_id_is_another_request(api: Api) -> None:
    stem = uuid.uuid4().hex[:10]
    upper, lower = f"JOB-{stem}", f"job-{stem}"
    assert api.admin.post(f"/v1/tenants/{api.tenant}/requests",
                          json={"id": upper, "cost": {"gpu": 1}}).status_code == 202
    missing = api.admin.get(f"/v1/tenants/{api.tenant}/requests/{lower}")
    assert missing.status_code == 404, missing.text
    assert api.admin.put("/v1/tenants/team-b", json={"quota": {"gpu": 1}}).status_code == 200
    other = api.admin.post("/v1/tenants/team-b/requests", json={"id": lower, "cost": {"gpu": 1}})
    assert other.status_code == 202, other.text


def _cursor(text: bytes) -> str:
    return base64.urlsafe_b64encode(text).decode()


@pytest.mark.parametrize(
    "cursor",
    [_cursor(b'[1e30,"a"]'), _cursor(b'[NaN,"a"]'), _cursor(b'[1e999,"a"]'),
     _cursor(b'[1800000000.0,"a\\u0000b"]'), "%00"],
)
def test_a_forged_cursor_is_400_invalid_cursor(api: Api, cursor: str) -> None:
    listed = api.admin.get(f"/v1/tenants/{api.tenant}/requests", params={"cursor": cursor})
    assert listed.status_code == 400, listed.text
    assert listed.json()["code"] == "invalid_cursor"


@pytest.mark.parametrize("cursor", [_cursor(b"[1e30]"), _cursor(b"[NaN]"),
                                    _cursor(b"[99999999999999999999999]")])
def test_a_forged_audit_cursor_is_400_invalid_cursor(api: Api, cursor: str) -> None:
    listed = api.admin.get("/v1/audit", params={"cursor": cursor})
    assert listed.status_code == 400, listed.text
    assert listed.json()["code"] == "invalid_cursor"


def test_a_nul_in_a_reason_is_400_and_the_request_stays(api: Api) -> None:
    request_id = f"r-{uuid.uuid4().hex[:10]}"
    assert api.admin.post(f"/v1/tenants/{api.tenant}/requests",
                          json={"id": request_id, "cost": {"gpu": 1}}).status_code == 202
    path = f"/v1/tenants/{api.tenant}/requests/{request_id}"
    refused = api.admin.post(f"{path}/cancel", json={"reason": "stop\u0000now"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "invalid_input"
    assert api.admin.get(path).json()["state"] in ("waiting", "reserved", "delivered")


def test_a_token_hammering_a_refused_operation_writes_one_audit_row(api: Api) -> None:
    tenant = f"h-{uuid.uuid4().hex[:8]}"
    assert api.admin.put(f"/v1/tenants/{tenant}", json={"quota": {"gpu": 1}}).status_code == 200
    token = make_token(api.db_url, tenant=tenant, label="hammer")
    with httpx.Client(base_url=api.admin.base_url, headers=bearer(token), timeout=30) as me:
        for _ in range(25):
            refused = me.get(f"/v1/tenants/{api.tenant}/requests")
            assert refused.status_code == 403, refused.text
        entries = me.get("/v1/audit", params={"limit": 500}).json()["entries"]
    refusals = [entry for entry in entries
                if entry["outcome"] == "refused" and entry["operation"] == "request.list"]
    assert len(refusals) == 1, refusals
    assert refusals[0]["target"] == f"tenant/{api.tenant}"


def test_serve_prunes_past_retention_when_told_to(tmp_path: Path) -> None:
    day = 86400.0
    with fresh_database("sqlite", tmp_path) as db_url:
        with Quotagate.connect(db_url, clock=ManualClock(start=time.time() - 40 * day)) as gate:
            gate.set_tenant("team-a", {"gpu": 100})
            gate.set_pool("main", {"gpu": 100})
            gate.submit("old-done", "team-a", {"gpu": 1})
            gate.submit("old-waiting", "team-a", {"gpu": 100})
            gate.set_tenant("team-a", {"gpu": 4})  # old-waiting never fits now
            gate.admit_until_idle()
            gate.complete("old-done")
        token = make_token(db_url)
        with running_server(db_url, tmp_path, args=["--prune-older-than", "30d"]) as server:
            path = f"{server.url}/v1/tenants/team-a/requests/old-done"
            until = time.monotonic() + 60
            while httpx.get(path, headers=bearer(token)).status_code != 404:
                assert time.monotonic() < until, "serve never pruned the finished request"
                time.sleep(0.1)
            waiting = httpx.get(f"{server.url}/v1/tenants/team-a/requests/old-waiting",
                                headers=bearer(token))
            # serve expires it (TTL) meanwhile, which makes it recent history: it stays.
            assert waiting.status_code == 200, waiting.text


def test_an_unknown_query_parameter_is_400_not_ignored(api: Api) -> None:
    typo = api.admin.get("/v1/audit", params={"tenat": api.tenant})
    assert typo.status_code == 400, typo.text
    assert typo.json()["code"] == "unknown_parameter"
    assert "tenant" in typo.json()["message"]  # says what the operation takes
    assert api.admin.get("/v1/audit", params={"tenant": api.tenant}).status_code == 200


def test_a_whole_number_written_with_a_fraction_is_that_number(api: Api) -> None:
    request_id = f"w-{uuid.uuid4().hex[:10]}"
    answer = _raw_submit(api, b'{"id":"%s","cost":{"gpu":2.0},"priority":3.0}'
                         % request_id.encode())
    assert answer.status_code == 202, answer.text
    assert answer.json()["cost"] == {"gpu": 2} and answer.json()["priority"] == 3
    for cost in (b"true", b'"1"', b"1.5"):
        refused = _raw_submit(api, b'{"id":"%s-x","cost":{"gpu":%s}}'
                              % (request_id.encode(), cost))
        assert refused.status_code == 422, (cost, refused.text)


def test_a_batch_for_a_malformed_tenant_is_one_400(api: Api) -> None:
    answer = api.admin.post("/v1/tenants/Team_A/requests:batch",
                            json={"requests": [{"id": "b-1", "cost": {"gpu": 1}}]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_tenant_name"


def test_the_document_states_errors_and_constraints(api: Api) -> None:
    document = api.admin.get("/openapi.json").json()
    error_ref = "#/components/schemas/ErrorBody"
    assert set(document["components"]["schemas"]["ErrorBody"]["required"]) == {"code", "message"}
    operations = [(path, method, operation) for path, methods in document["paths"].items()
                  if path.startswith("/v1/") for method, operation in methods.items()]
    assert len(operations) >= 20
    for path, method, operation in operations:
        for status in ("400", "401", "403", "404", "409", "413", "422", "429", "503"):
            content = operation["responses"][status]["content"]["application/json"]
            assert content["schema"]["$ref"] == error_ref, (method, path, status)
        for parameter in operation.get("parameters", []):
            if parameter["name"] in ("tenant", "request_id", "pool", "topic"):
                schema = parameter["schema"]
                strings = [branch for branch in schema.get("anyOf", [schema])
                           if branch.get("type") == "string"]
                assert strings and all(branch["pattern"].startswith("^") and branch["maxLength"]
                                       for branch in strings), (path, schema)
    submit = document["components"]["schemas"]["SubmitBody"]["properties"]
    assert submit["id"]["maxLength"] == 128
    assert submit["priority"] == {**submit["priority"], "minimum": -1_000_000,
                                  "maximum": 1_000_000}
    assert submit["cost"]["additionalProperties"]["minimum"] == 1
    assert submit["cost"]["propertyNames"]["pattern"] == "^[a-z][a-z0-9_]{0,31}$"


def test_completing_or_failing_a_waiting_request_is_409_invalid_transition(api: Api) -> None:
    request_id, tenant = f"t-{uuid.uuid4().hex[:10]}", f"t-{uuid.uuid4().hex[:8]}"
    put_stalled_tenant(api.admin, tenant)
    submitted = api.admin.post(f"/v1/tenants/{tenant}/requests",
                               json={"id": request_id, "cost": {"gpu": 1}})  # never admitted
    assert submitted.status_code == 202, submitted.text
    path = f"/v1/tenants/{tenant}/requests/{request_id}"
    for verb in ("complete", "fail"):
        refused = api.admin.post(f"{path}/{verb}")
        assert refused.status_code == 409, (verb, refused.text)
        assert refused.json()["code"] == "invalid_transition"
    assert api.admin.get(path).json()["state"] == "waiting"


def test_a_listing_is_newest_first_and_pages_without_gaps_or_repeats(api: Api) -> None:
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    put_stalled_tenant(api.admin, tenant)
    submitted = []
    for number in range(7):
        request_id = f"l-{number:02d}"
        assert api.admin.post(f"/v1/tenants/{tenant}/requests",
                              json={"id": request_id, "cost": {"gpu": 1}}).status_code == 202
        submitted.append(request_id)
    seen: list[dict[str, object]] = []
    cursor = None
    while True:
        params: dict[str, object] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.admin.get(f"/v1/tenants/{tenant}/requests", params=params).json()
        seen += page["requests"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [item["id"] for item in seen] == list(reversed(submitted))
    keys = [(item["created"], item["id"]) for item in seen]
    assert keys == sorted(keys, reverse=True)  # by created, then id, newest first


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_rejections_refusals_and_admission_passes_are_in_the_metrics(api: Api) -> None:
    before = api.admin.get("/metrics").text
    bad = api.admin.post(f"/v1/tenants/{api.tenant}/requests",
                         json={"id": "m-1", "cost": {"gpu": 0}})
    assert bad.status_code == 400
    token = make_token(api.db_url, tenant=api.tenant)
    with httpx.Client(base_url=api.admin.base_url, headers=bearer(token), timeout=30) as tenant:
        assert tenant.get("/v1/pools/main").status_code == 403
    unauthenticated = httpx.get(f"{api.admin.base_url}/v1/usage", timeout=30)
    assert unauthenticated.status_code == 401
    until = time.monotonic() + 30
    while True:  # the admission loop runs every 0.05 s: wait for one more pass
        after = api.admin.get("/metrics").text
        passes = (_metric(after, "quotagate_admission_pass_seconds_count")
                  - _metric(before, "quotagate_admission_pass_seconds_count"))
        if passes > 0 or time.monotonic() > until:
            break
        time.sleep(0.05)
    assert passes > 0
    for name, labels in (
        ("quotagate_rejections_total", {"tenant": api.tenant, "code": "invalid_cost"}),
        ("quotagate_auth_refusals_total", {"reason": "forbidden"}),
        ("quotagate_auth_refusals_total", {"reason": "unauthenticated"}),
    ):
        assert _metric(after, name, **labels) - _metric(before, name, **labels) >= 1, (name, labels)


def test_serve_gives_up_its_delivery_lease_on_sigterm(tmp_path: Path) -> None:
    with fresh_database("sqlite", tmp_path) as db_url:
        server = start_server(db_url, tmp_path, args=["--worker-name", "edge-2"])
        try:
            with Quotagate.connect(db_url) as gate:
                until = time.monotonic() + 60
                while not any(row.name == "worker/edge-2" and row.owner == "edge-2"
                              for row in gate_leases(gate)):
                    assert time.monotonic() < until, server.log()
                    time.sleep(0.05)
        finally:
            status = server.stop()
        assert status == 0, server.log()
        with Quotagate.connect(db_url) as gate:
            [lease] = [row for row in gate_leases(gate) if row.name == "worker/edge-2"]
        assert lease.owner is None, "the lease was left to expire instead of released"


def gate_leases(gate: Quotagate) -> list[Any]:
    with gate.engine.connect() as connection:
        return list(connection.execute(sa.select(schema.lease)))


def test_with_the_rate_store_down_tenants_without_a_rate_quota_are_still_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        with fresh_database("sqlite", tmp_path) as db_url:
            with Quotagate.connect(db_url, rate_store=redis.url) as gate:
                gate.set_pool("main", {"gpu": 10})
                gate.set_tenant("limited", {"gpu": 5})
                gate.set_tenant("unlimited", {"gpu": 5})
                gate.set_rate("limited", {"capacity": 100, "refill_per_second": 0})
            token = make_token(db_url)
            monkeypatch.setenv("QUOTAGATE_RATE_STORE", redis.url)  # serve's only way, today
            server = start_server(db_url, tmp_path)
            try:
                with httpx.Client(base_url=server.url, headers=bearer(token), timeout=30) as admin:
                    assert admin.post("/v1/tenants/limited/requests",
                                      json={"id": "l-1", "cost": {"gpu": 1}}).status_code == 202
                    redis.kill()
                    served = admin.post("/v1/tenants/unlimited/requests",
                                        json={"id": "u-1", "cost": {"gpu": 1}})
                    assert served.status_code == 202, served.text
                    refused = admin.post("/v1/tenants/limited/requests",
                                         json={"id": "l-2", "cost": {"gpu": 1}})
                    assert refused.status_code == 503, refused.text
                    assert admin.get("/v1/tenants/limited/requests/l-2").status_code == 404
            finally:
                server.stop()
    finally:
        redis.kill()
