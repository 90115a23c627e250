"""The stream routes through a replaced authorizer, and the stream metrics on /metrics.

The app is built with ``create_app(gate, authorizer=...)`` and served by a real
uvicorn server in a thread, so the test holds the hook and runs a consumer in the
same process as the server: its counters are the ones ``/metrics`` exports.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import redis

from quotagate import Quotagate
from quotagate.auth.authorizer import Actor
from quotagate.http import create_app
from quotagate.streams.consumer import Entry
from quotagate.streams.keys import StreamKeys
from support.databases import fresh_database
from support.http_servers import bearer, make_token, serving
from support.redis_servers import RedisServer
from support.streams import keys_of, new_tenant, stream_gate


def test_the_authorizer_decides_topic_creation_and_a_refusal_creates_nothing(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    decisions: list[tuple[str | None, str, str]] = []

    def admins_create_topics(tenant: str | None, actor: Actor, operation: str) -> bool:
        decisions.append((tenant, actor.name, operation))
        return actor.admin or (actor.tenant == tenant and operation != "topic.create")

    tenant = new_tenant()
    with fresh_database("sqlite", tmp_path) as db_url, stream_gate(
            db_url, private_redis.url) as gate:
        gate.set_tenant(tenant, {"partitions": 4, "parallelism": 4})
        admin, own = make_token(db_url), make_token(db_url, tenant=tenant)
        own_actor = f"token:{own.split('_')[1]}"
        with serving(create_app(gate, authorizer=admins_create_topics)) as url:
            path = f"{url}/v1/tenants/{tenant}/topics/orders"
            body = {"partitions": 2, "parallelism": 1}
            refused = httpx.put(path, json=body, headers=bearer(own))
            assert refused.status_code == 404 and refused.json()["code"] == "unknown_topic"
            assert decisions == [(tenant, own_actor, "topic.create")]
            assert gate.streams.list_topics(tenant) == []
            assert {row["resource"]: row["used"] for row in gate.usage()["tenants"]
                    if row["tenant"] == tenant} == {"partitions": 0, "parallelism": 0}
            client = redis.Redis.from_url(private_redis.url)
            assert keys_of(client, f"*tenant:{tenant}:*") == []
            client.close()
            created = httpx.put(path, json=body, headers=bearer(admin))
            assert created.status_code == 200, created.text
            produced = httpx.post(f"{path}/messages", json={"data": "x"}, headers=bearer(own))
            assert produced.status_code == 200
    assert decisions[1][2] == "topic.create" and decisions[2][1:] == (own_actor, "stream.produce")


def test_metrics_carry_tenant_and_topic_for_every_stream_counter(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    tenant = new_tenant()
    with fresh_database("sqlite", tmp_path) as db_url, Quotagate.connect(
            db_url, redis=private_redis.url) as gate:
        gate.set_tenant(tenant, {"partitions": 1, "parallelism": 1})
        gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1, max_len=100)
        producer = gate.streams.producer(tenant, "orders")
        for _ in range(5):
            producer.send_many([f"m{index}" for index in range(100)] + ["bad"])
        failures: set[str] = set()

        def handler(entry: Entry) -> None:
            if entry.text == "bad" or (entry.text == "m7" and entry.id not in failures):
                failures.add(entry.id)
                raise ValueError("no")  # "bad" always; "m7" once, then redelivered

        with gate.streams.consumer(tenant, "orders", "billing", "c1", visibility_timeout=0.1,
                                   max_deliveries=2, lease_ttl=1.0) as consumer:
            consumer.run(handler, until_idle=0.5)
        gate.streams.status(tenant, "orders")  # a status read records lag and trimmed
        dlq = redis.Redis.from_url(private_redis.url)
        dead = dlq.xlen(StreamKeys(tenant).dlq("orders"))
        dlq.close()
        with serving(create_app(gate)) as url:
            text = httpx.get(f"{url}/metrics").text
    labels = f'tenant="{tenant}",topic="orders"'
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if labels in line}
    assert values["quotagate_stream_produced_total"] == 505
    assert values["quotagate_stream_consumed_total"] >= values["quotagate_stream_acked_total"] > 0
    assert values["quotagate_stream_redelivered_total"] >= 1
    assert values["quotagate_stream_dead_lettered_total"] == dead >= 1
    assert values["quotagate_stream_trimmed"] > 0  # 505 appended, max length 100
    assert f'quotagate_stream_lag{{group="billing",{labels}}} 0.0' in text
