"""Batch submit (``POST /v1/tenants/{t}/requests:batch``) over HTTP, on every SQL backend.

Each entry must be answered exactly as a single submit of it would be, in
order, and an entry that fails must write nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from quotagate import Quotagate
from quotagate.auth.tokens import TokenStore
from quotagate.http import create_app
from quotagate.store import schema
from support.http_servers import serving
from support.ledger_state import count, snapshot

BATCH = "/v1/tenants/team-a/requests:batch"
SINGLE = "/v1/tenants/team-a/requests"


@dataclass
class Served:
    gate: Quotagate
    http: httpx.Client


@pytest.fixture
def served(db_url: str) -> Iterator[Served]:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 100})
        gate.set_tenant("team-a", {"gpu": 10})
        gate.set_tenant("team-b", {"gpu": 10})
        token = TokenStore(gate.engine).create(tenant="team-a").token
        with serving(create_app(gate)) as url, httpx.Client(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}"}
        ) as http:
            yield Served(gate, http)


def test_a_batch_answers_each_entry_as_a_single_submit_would_in_order(served: Served) -> None:
    gate, http = served.gate, served.http
    gate.submit("old", "team-a", {"gpu": 1})
    gate.submit("theirs", "team-b", {"gpu": 1})
    entries: list[dict[str, Any]] = [
        {"id": "new-1", "cost": {"gpu": 1}, "payload": {"n": 1}},
        {"id": "old", "cost": {"gpu": 1}},                      # identical replay
        {"id": "old", "cost": {"gpu": 2}},                      # changed replay
        {"id": "bad-resource", "cost": {"tpu": 1}},
        {"id": "bad id!", "cost": {"gpu": 1}},
        {"id": "bad-target", "cost": {"gpu": 1}, "target": "nowhere"},
        {"id": "theirs", "cost": {"gpu": 1}},                   # another tenant's id
        {"id": "new-2", "cost": {"gpu": 2}, "priority": 3},
        {"id": "new-2", "cost": {"gpu": 2}, "priority": 3},     # repeated inside the batch
    ]
    answer = http.post(BATCH, json={"requests": entries})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [result["status"] for result in results] == [202, 200, 409, 400, 400, 404, 409, 202, 200]
    assert [(result["error"] or {}).get("code") for result in results] == [
        None, None, "request_conflict", "unknown_resource", "invalid_request_id",
        "unknown_target", "request_id_taken", None, None,
    ]
    assert results[0]["request"]["id"] == "new-1" and results[0]["request"]["state"] == "waiting"
    assert results[7]["request"]["priority"] == 3
    assert all(result["request"] is None for result in results[2:7])
    assert all(result["error"]["message"] for result in results[2:7])
    # The same answers a single submit gives, entry for entry.
    for entry, result in zip(entries[2:7], results[2:7], strict=True):
        single = http.post(SINGLE, json=entry)
        assert single.status_code == result["status"]
        assert single.json() == result["error"]
    # Bad entries wrote nothing: only the three new requests exist for team-a.
    with gate.engine.connect() as connection:
        ids = sorted(connection.execute(
            schema.request.select().with_only_columns(schema.request.c.id)
            .where(schema.request.c.tenant == "team-a")
        ).scalars())
    assert ids == ["new-1", "new-2", "old"]
    assert gate.show("old").cost == {"gpu": 1}


def test_more_than_a_thousand_entries_are_refused_whole(served: Served) -> None:
    before = snapshot(served.gate)
    audit = count(served.gate, schema.audit)
    entries = [{"id": f"r-{n}", "cost": {"gpu": 1}} for n in range(1001)]
    answer = served.http.post(BATCH, json={"requests": entries})
    assert answer.status_code == 413, answer.text
    assert answer.json()["code"] == "batch_too_large"
    assert "1000" in answer.json()["message"]
    assert snapshot(served.gate) == before
    assert count(served.gate, schema.audit) == audit


def test_a_thousand_entries_are_accepted(served: Served) -> None:
    entries = [{"id": f"k-{n}", "cost": {"gpu": 1}} for n in range(1000)]
    answer = served.http.post(BATCH, json={"requests": entries})
    assert answer.status_code == 200, answer.text
    assert {result["status"] for result in answer.json()["results"]} == {202}
    assert count(served.gate, schema.request, schema.request.c.tenant == "team-a") == 1000


def test_a_malformed_entry_refuses_the_whole_batch(served: Served) -> None:
    before = snapshot(served.gate)
    answer = served.http.post(BATCH, json={"requests": [
        {"id": "fine", "cost": {"gpu": 1}}, {"id": "broken", "cost": {"gpu": "one"}},
    ]})
    assert answer.status_code == 422, answer.text
    assert answer.json()["code"] == "invalid_input"
    assert snapshot(served.gate) == before


def test_a_batch_for_another_tenant_is_refused(served: Served) -> None:
    before = snapshot(served.gate)
    answer = served.http.post("/v1/tenants/team-b/requests:batch",
                              json={"requests": [{"id": "x", "cost": {"gpu": 1}}]})
    assert answer.status_code == 403, answer.text
    assert snapshot(served.gate) == before


def test_rate_limited_entries_answer_429_like_a_single_submit(served: Served) -> None:
    served.gate.set_rate("team-a", "capacity=1,refill=0")
    answer = served.http.post(BATCH, json={"requests": [
        {"id": "first", "cost": {"gpu": 1}}, {"id": "second", "cost": {"gpu": 1}},
    ]})
    results = answer.json()["results"]
    assert [result["status"] for result in results] == [202, 429]
    assert results[1]["error"]["code"] == "rate_quota_exhausted"
    single = served.http.post(SINGLE, json={"id": "third", "cost": {"gpu": 1}})
    assert single.status_code == 429
    assert single.json()["code"] == results[1]["error"]["code"]


def test_the_openapi_document_describes_batch_submit(served: Served) -> None:
    document = served.http.get("/openapi.json").json()
    operation = document["paths"]["/v1/tenants/{tenant}/requests:batch"]["post"]
    assert "413" in operation["responses"]
    schema_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = document["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert body["properties"]["requests"]["maxItems"] == 1000
