"""Topics and messages through a real `quotagate serve --redis …` over HTTP (SQLite ledger)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from support.databases import fresh_database
from support.http_servers import Server, bearer, make_token, running_server
from support.redis_servers import RedisServer
from support.streams import new_tenant


@dataclass
class Api:
    server: Server
    db_url: str
    admin: httpx.Client

    def tenant(self) -> tuple[str, httpx.Client]:
        name = new_tenant()
        response = self.admin.put(f"/v1/tenants/{name}",
                                  json={"quota": {"partitions": 4, "parallelism": 2}})
        assert response.status_code == 200, response.text
        token = make_token(self.db_url, tenant=name)
        return name, httpx.Client(base_url=self.server.url, headers=bearer(token), timeout=30)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, private_redis: RedisServer) -> Iterator[Api]:
    tmp_path = tmp_path_factory.mktemp("stream-http")
    with fresh_database("sqlite", tmp_path) as db_url:
        admin_token = make_token(db_url)
        with running_server(db_url, tmp_path, args=["--redis", private_redis.url]) as server, \
                httpx.Client(base_url=server.url, headers=bearer(admin_token), timeout=30) as admin:
            yield Api(server, db_url, admin)


def test_a_tenant_creates_produces_to_and_deletes_its_topic(api: Api) -> None:
    tenant, client = api.tenant()
    created = client.put(f"/v1/tenants/{tenant}/topics/orders",
                         json={"partitions": 2, "parallelism": 1})
    assert created.status_code == 200, created.text
    assert created.json()["partitions"] == 2
    one = client.post(f"/v1/tenants/{tenant}/topics/orders/messages", json={"data": "hello"})
    assert one.status_code == 200, one.text
    assert len(one.json()["ids"]) == 1
    batch = client.post(f"/v1/tenants/{tenant}/topics/orders/messages",
                        json={"messages": [{"data": "a", "key": "k"}, {"data": "b", "key": "k"}]})
    assert batch.status_code == 200 and len({i.split("/")[0] for i in batch.json()["ids"]}) == 1
    status = client.get(f"/v1/tenants/{tenant}/topics/orders/status").json()
    assert sum(p["length"] for p in status["partitions"]) == 3
    over = client.put(f"/v1/tenants/{tenant}/topics/more", json={"partitions": 3,
                                                                 "parallelism": 1})
    assert over.status_code == 409 and over.json()["code"] == "topic_quota_exceeded"
    assert [t["topic"] for t in client.get(f"/v1/tenants/{tenant}/topics").json()["topics"]] == [
        "orders"]
    assert client.delete(f"/v1/tenants/{tenant}/topics/orders").status_code == 200
    gone = client.post(f"/v1/tenants/{tenant}/topics/orders/messages", json={"data": "late"})
    assert gone.status_code == 404 and gone.json()["code"] == "unknown_topic"


def test_another_tenants_token_gets_404_for_a_topic_of_the_same_name(api: Api) -> None:
    owner, owner_client = api.tenant()
    other, other_client = api.tenant()
    for tenant, client in ((owner, owner_client), (other, other_client)):
        response = client.put(f"/v1/tenants/{tenant}/topics/orders",
                              json={"partitions": 1, "parallelism": 1})
        assert response.status_code == 200, response.text
    owner_client.post(f"/v1/tenants/{owner}/topics/orders/messages", json={"data": "secret"})
    path = f"/v1/tenants/{owner}/topics/orders"
    for method, suffix, body in (("GET", "", None), ("DELETE", "", None),
                                 ("GET", "/status", None),
                                 ("POST", "/messages", {"data": "spoof"}),
                                 ("PUT", "", {"partitions": 1, "parallelism": 1})):
        response = other_client.request(method, path + suffix, json=body)
        assert response.status_code == 404, (method, suffix, response.text)
        assert response.json()["code"] == "unknown_topic"
    listing = other_client.get(f"/v1/tenants/{owner}/topics")
    assert listing.status_code == 404 and listing.json() == {
        "code": "unknown_topic", "message": f"topics of tenant {owner!r} do not exist"}
    # The same answer for a tenant that does not exist at all: existence is not told.
    absent = other_client.get("/v1/tenants/no-such-tenant/topics").json()
    assert absent["message"] == "topics of tenant 'no-such-tenant' do not exist"
    # The other tenant's own topic of that name saw nothing.
    status = other_client.get(f"/v1/tenants/{other}/topics/orders/status").json()
    assert status["partitions"][0]["length"] == 0
    assert owner_client.get(f"{path}/status").json()["partitions"][0]["length"] == 1


def test_a_producer_over_its_rate_gets_429_with_retry_after_and_it_is_counted(api: Api) -> None:
    tenant, client = api.tenant()
    response = client.put(f"/v1/tenants/{tenant}/topics/orders", json={
        "partitions": 1, "parallelism": 1, "rate": {"capacity": 2, "refill_per_second": 0.5}})
    assert response.status_code == 200, response.text
    path = f"/v1/tenants/{tenant}/topics/orders/messages"
    assert client.post(path, json={"messages": [{"data": "a"}, {"data": "b"}]}).status_code == 200
    refused = client.post(path, json={"data": "c"})
    assert refused.status_code == 429 and refused.json()["code"] == "rate_quota_exhausted"
    assert int(refused.headers["Retry-After"]) >= 1
    metrics = httpx.get(f"{api.server.url}/metrics").text
    assert f'quotagate_stream_produced_total{{tenant="{tenant}",topic="orders"}} 2.0' in metrics
    assert f'quotagate_stream_refused_total{{tenant="{tenant}",topic="orders"}} 1.0' in metrics


def test_bad_topic_specs_are_refused_with_a_code(api: Api) -> None:
    tenant, client = api.tenant()
    zero = client.put(f"/v1/tenants/{tenant}/topics/orders", json={"partitions": 0,
                                                                   "parallelism": 1})
    assert zero.status_code == 400 and zero.json()["code"] == "invalid_partitions"
    shape = client.put(f"/v1/tenants/{tenant}/topics/orders", json={"partitions": "2"})
    assert shape.status_code == 422


def test_a_message_with_a_lone_surrogate_is_400_and_appends_nothing(api: Api) -> None:
    tenant, client = api.tenant()
    created = client.put(f"/v1/tenants/{tenant}/topics/orders",
                         json={"partitions": 1, "parallelism": 1})
    assert created.status_code == 200, created.text
    path = f"/v1/tenants/{tenant}/topics/orders/messages"
    for body in (b'{"data": "a\\ud800b"}', b'{"data": "ok", "key": "\\udfff"}',
                 b'{"messages": [{"data": "fine"}, {"data": "\\ud83d"}]}'):
        refused = client.post(path, content=body, headers={"Content-Type": "application/json"})
        # pydantic refuses lone surrogates in a string field as it parses (422); the
        # producer itself refuses them too, for Python callers (400 invalid_message).
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "invalid_input"
    status = client.get(f"/v1/tenants/{tenant}/topics/orders/status").json()
    assert sum(partition["length"] for partition in status["partitions"]) == 0
    assert client.post(path, json={"data": "after"}).status_code == 200
