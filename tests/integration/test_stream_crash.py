"""A consumer SIGKILLed mid-batch: a new one (same name) takes over at generation + 1,
every message is processed at least once and acked exactly once."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import redis

from quotagate import Quotagate
from quotagate.streams.keys import StreamKeys
from support.databases import fresh_database
from support.redis_servers import RedisServer
from support.stream_workers import consume_with_log, read_log
from support.streams import stream_gate, tenant_with_quota
from support.waiting import wait_for

MESSAGES = 60


def _start(context: multiprocessing.context.SpawnContext, db_url: str, redis_url: str,
           tenant: str, log: Path, block_on: str | None) -> multiprocessing.process.BaseProcess:
    process = context.Process(target=consume_with_log, args=(
        db_url, redis_url, tenant, "orders", "g", "worker", str(log), block_on, 1.0))
    process.start()
    return process


def test_a_consumer_killed_mid_batch_is_taken_over_and_nothing_is_lost_or_acked_twice(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    with fresh_database("sqlite", tmp_path) as db_url, stream_gate(
        db_url, private_redis.url
    ) as gate:
        tenant = _topic_with_messages(gate)
        context = multiprocessing.get_context("spawn")
        first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
        # The first consumer hangs in its handler on message 25, in the middle of a batch
        # of 10 whose first entries it has processed but not acked.
        first = _start(context, db_url, private_redis.url, tenant, first_log, "m-25")
        wait_for(lambda: "blocked" in read_log(first_log), "the first consumer to block",
                 timeout=60)
        os.kill(first.pid or 0, signal.SIGKILL)
        first.join(timeout=30)
        assert first.exitcode == -signal.SIGKILL
        second = _start(context, db_url, private_redis.url, tenant, second_log, None)
        second.join(timeout=120)
        assert second.exitcode == 0

        first_lines, second_lines = read_log(first_log), read_log(second_log)
        generations = [int(line.split()[2]) for line in first_lines + second_lines
                       if line.startswith("owns")]
        assert generations == [1, 2]  # same name, but a new generation
        processed = {line.split()[2] for line in first_lines + second_lines
                     if line.startswith("processed")}
        assert processed == {f"m-{index}" for index in range(MESSAGES)}
        # Some entries were processed twice (the killed batch); each was acked once.
        acked = sum(int(line.split()[1]) for line in first_lines + second_lines
                    if line.startswith("acked"))
        assert acked == MESSAGES
        assert any(line.endswith(" m-24") for line in first_lines)
        assert any(line.endswith(" m-24") for line in second_lines)

        status = gate.streams.status(tenant, "orders")
        (group,) = status.partitions[0].groups
        assert group.pending == 0 and group.generation == 2
        client = redis.Redis.from_url(private_redis.url)
        newest = client.xrevrange(StreamKeys(tenant).partition("orders", 0), count=1)[0][0]
        assert group.frontier == newest.decode()
        client.close()


def _topic_with_messages(gate: Quotagate) -> str:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    gate.streams.producer(tenant, "orders").send_many(
        [f"m-{index}" for index in range(MESSAGES)])
    return tenant


def test_a_killed_consumers_share_of_the_in_flight_cap_comes_back(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """The tenant's cap is 10 and a consumer holding 10 is SIGKILLed: another consumer of
    the tenant (another topic) gets nothing until the dead one's heartbeat expires, then
    the whole cap, and the dead instance's count is gone."""
    with fresh_database("sqlite", tmp_path) as db_url, stream_gate(
        db_url, private_redis.url
    ) as gate:
        tenant = tenant_with_quota(gate)
        gate.streams.set_settings(tenant, max_in_flight=10)
        for topic in ("orders", "payments"):
            gate.streams.create_topic(tenant, topic, partitions=1, parallelism=1)
            gate.streams.producer(tenant, topic).send_many([f"m-{i}" for i in range(20)])
        context = multiprocessing.get_context("spawn")
        log = tmp_path / "first.log"
        first = _start(context, db_url, private_redis.url, tenant, log, "m-0")
        wait_for(lambda: "blocked" in read_log(log), "the first consumer to hold its batch",
                 timeout=60)
        other = gate.streams.consumer(tenant, "payments", "g", "c2", batch=10, lease_ttl=1.0)
        assert other.poll() == []  # the first holds the whole cap
        os.kill(first.pid or 0, signal.SIGKILL)
        first.join(timeout=30)
        got: list[object] = []

        def share_came_back() -> bool:
            got.extend(other.poll())
            return bool(got)

        wait_for(share_came_back, "the killed consumer's share to expire", timeout=30)
        assert len(got) == 10
        client = redis.Redis.from_url(private_redis.url)
        assert list(client.hkeys(StreamKeys(tenant).in_flight())) == [other.instance.encode()]
        client.close()
        other.close()
