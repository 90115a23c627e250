"""The stream layer against a real Redis of these tests' own (and a real Redis Cluster).

The ledger is SQLite here unless a test is about the ledger or the rate store,
which then runs on every SQL backend. The Redis is private (``private_redis``),
so a test may look at every key in it.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from quotagate import NotFound, Quotagate, RateLimited, StaleGeneration
from quotagate.domain.bucket import parse_rate
from quotagate.streams import metrics
from quotagate.streams.consumer import Entry
from quotagate.streams.keys import StreamKeys
from support.databases import fresh_database
from support.redis_servers import RedisCluster, RedisServer
from support.stream_workers import produce_until_refused
from support.streams import keys_of, stream_gate, tenant_with_quota
from support.waiting import wait_for


@pytest.fixture
def gate(tmp_path: Path, private_redis: RedisServer) -> Iterator[Quotagate]:
    with fresh_database("sqlite", tmp_path) as db_url, stream_gate(db_url, private_redis.url) as q:
        yield q


@pytest.fixture
def client(private_redis: RedisServer) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(private_redis.url)
    yield connection
    connection.close()


def _drain(gate: Quotagate, tenant: str, topic: str, group: str = "g") -> list[Entry]:
    seen: list[Entry] = []
    with gate.streams.consumer(tenant, topic, group, "c1", lease_ttl=1.0) as consumer:
        consumer.run(seen.append, until_idle=0.3)
    return seen


def test_the_default_tenant_uses_todays_key_names(gate: Quotagate, client: redis.Redis) -> None:
    client.flushall()  # our own Redis: we may look at every key
    gate.set_tenant("default", {"partitions": 1, "parallelism": 1})
    gate.streams.create_topic("default", "orders", partitions=1, parallelism=1)
    gate.streams.producer("default", "orders").send("hello")
    assert [entry.text for entry in _drain(gate, "default", "orders", "billing")] == ["hello"]
    assert keys_of(client, "*") == [
        "stream:topic:orders:0",
        "streaming:mq:frontier:orders:billing:0",
        "streaming:mq:lease:orders:billing:0",
        "streaming:mq:meta:orders",
        "streaming:mq:topics",
    ]


def test_two_tenants_with_a_topic_of_the_same_name_stay_apart(
    gate: Quotagate, client: redis.Redis
) -> None:
    first, second = tenant_with_quota(gate), tenant_with_quota(gate)
    for tenant in (first, second):
        gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    gate.streams.producer(first, "orders").send_many(["a1", "a2", "a3"])
    gate.streams.producer(second, "orders").send_many(["b1", "b2"])
    assert sorted(entry.text for entry in _drain(gate, first, "orders")) == ["a1", "a2", "a3"]
    assert sorted(entry.text for entry in _drain(gate, second, "orders")) == ["b1", "b2"]
    lengths = {tenant: sum(p.length for p in gate.streams.status(tenant, "orders").partitions)
               for tenant in (first, second)}
    assert lengths == {first: 3, second: 2}
    first_keys, second_keys = (set(keys_of(client, f"*tenant:{t}:*")) for t in (first, second))
    assert first_keys and second_keys and not first_keys & second_keys
    assert all(f"tenant:{first}:" in name for name in first_keys)


@pytest.mark.parametrize("rate_store", ["ledger", "redis"])
def test_concurrent_producers_never_exceed_the_topic_bucket(
    rate_store: str, db_url: str, private_redis: RedisServer, client: redis.Redis
) -> None:
    """Four producer processes, 12 sends each, against a bucket of 20 without refill."""
    store_url = private_redis.url if rate_store == "redis" else None
    with stream_gate(db_url, private_redis.url, rate_store=store_url) as gate:
        tenant = tenant_with_quota(gate)
        gate.streams.create_topic(tenant, "orders", partitions=3, parallelism=1,
                                  rate=parse_rate("capacity=20,refill=0"))
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(4), context.Queue()
        processes = [context.Process(target=produce_until_refused, args=(
            db_url, private_redis.url, store_url, tenant, "orders", 12, barrier, results))
            for _ in range(4)]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0
        assert sum(granted for granted, _ in outcomes) == 20
        assert sum(refused for _, refused in outcomes) == 28
        status = gate.streams.status(tenant, "orders")
        assert sum(partition.length for partition in status.partitions) == 20
        with pytest.raises(RateLimited) as refused:
            gate.streams.producer(tenant, "orders").send("one more")
        assert refused.value.retry_after > 0 and refused.value.code == "rate_quota_exhausted"


@pytest.mark.parametrize("rate_store", ["ledger", "redis"])
def test_a_refused_batch_writes_nothing_and_is_counted(
    rate_store: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    """Both paths: take then append (bucket in the ledger), and the fused script (bucket in
    the topic's own Redis)."""
    store_url = private_redis.url if rate_store == "redis" else None
    with fresh_database("sqlite", tmp_path) as db_url, stream_gate(
            db_url, private_redis.url, rate_store=store_url) as gate:
        _refused_batch(gate, fused=rate_store == "redis")


def _refused_batch(gate: Quotagate, *, fused: bool) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1,
                              rate=parse_rate("capacity=5,refill=0"))
    producer = gate.streams.producer(tenant, "orders")
    producer.send_many(["x"] * 3)
    assert (producer._bucket_key is not None) == fused
    before = metrics.count("refused", tenant, "orders")
    with pytest.raises(RateLimited):
        producer.send_many(["y"] * 3)  # all or none: 2 tokens are not enough for 3
    assert metrics.count("refused", tenant, "orders") == before + 3
    assert gate.streams.status(tenant, "orders").partitions[0].length == 3
    producer.send_many(["z"] * 2)


def test_a_blocking_producer_waits_for_the_bucket(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1,
                              rate=parse_rate("capacity=2,refill=20"))
    producer = gate.streams.producer(tenant, "orders", block=True, timeout=5.0)
    producer.send_many(["a", "b"])
    producer.send_many(["c", "d"])  # waits ~0.1 s for two tokens instead of failing
    assert gate.streams.status(tenant, "orders").partitions[0].length == 4


def test_max_length_is_honoured(gate: Quotagate, client: redis.Redis) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1, max_len=300)
    producer = gate.streams.producer(tenant, "orders")
    for _ in range(10):
        producer.send_many([f"m{index}" for index in range(400)])
    # MAXLEN ~ trims whole macro nodes: at most one node's worth above the cap.
    node = int(client.config_get("stream-node-max-entries")["stream-node-max-entries"])
    status = gate.streams.status(tenant, "orders")
    for partition in status.partitions:
        assert 300 <= partition.length <= 300 + node
        assert partition.trimmed == 2000 - partition.length


def test_keys_decide_the_partition(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=4, parallelism=1)
    ids = gate.streams.producer(tenant, "orders").send_many([("m", "user-7")] * 5)
    assert len({entry_id.split("/")[0] for entry_id in ids}) == 1
    assert {entry.key for entry in _drain(gate, tenant, "orders")} == {"user-7"}


def test_an_entry_goes_to_the_dlq_with_its_error_after_n_deliveries(
    gate: Quotagate, client: redis.Redis
) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    gate.streams.producer(tenant, "orders").send_many(["ok-1", "bad", "ok-2"])
    attempts: list[str] = []

    def handler(entry: Entry) -> None:
        attempts.append(entry.text)
        if entry.text == "bad":
            raise ValueError("cannot parse 'bad'")

    with gate.streams.consumer(tenant, "orders", "g", "c1", visibility_timeout=0.1,
                               max_deliveries=3) as consumer:
        acked = consumer.run(handler, until_idle=0.5)
    assert acked == 2
    assert attempts.count("bad") == 3 and attempts.count("ok-1") == 1
    (_dead_id, fields), = client.xrange(StreamKeys(tenant).dlq("orders"))
    assert fields[b"data"] == b"bad"
    assert fields[b"error"] == b"ValueError: cannot parse 'bad'"
    assert fields[b"deliveries"] == b"3"
    status = gate.streams.status(tenant, "orders")
    assert status.dlq_length == 1
    assert status.partitions[0].groups[0].pending == 0
    assert metrics.count("dead_lettered", tenant, "orders") == 1


def test_a_consumer_revived_after_a_takeover_cannot_ack_advance_or_move(
    gate: Quotagate, client: redis.Redis
) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    gate.streams.producer(tenant, "orders").send_many(["m1", "m2", "m3"])
    old = gate.streams.consumer(tenant, "orders", "g", "worker", lease_ttl=0.3,
                                visibility_timeout=0.1, max_deliveries=1)
    taken = old.poll()
    assert [entry.text for entry in taken] == ["m1", "m2", "m3"]
    first_generation = old.owned[0].lease.generation
    # The same name, in a new process: it waits for the lease to expire, then takes over.
    new = gate.streams.consumer(tenant, "orders", "g", "worker", lease_ttl=5.0)

    def took_over() -> bool:
        new.tick()
        return 0 in new.owned

    wait_for(took_over, "the takeover after the old lease expired", timeout=10)
    assert new.owned[0].lease.generation == first_generation + 1
    frontier_key = StreamKeys(tenant).frontier("orders", "g", 0)
    believed = old.owned[0]  # what the revived process still believes it holds
    result = old.settle(taken)
    assert result.acked == 0 and result.refused
    assert isinstance(result.refused[0], StaleGeneration)
    assert client.get(frontier_key) is None
    assert old.owned == {}  # it was told, and let the partition go
    # Were it to act on its belief anyway, its claim (which would move the entries to
    # the DLQ: max_deliveries=1) and its reads are refused as well.
    time.sleep(0.15)  # past the visibility timeout, so a claim would act
    believed.takeover, believed.next_claim = False, 0.0
    old.owned[0] = believed
    old._next_tick = float("inf")  # no heartbeat: only the fenced scripts stand in the way
    assert old.poll() == []
    assert old.owned == {} and len(old.refusals) == 2
    assert client.xlen(StreamKeys(tenant).dlq("orders")) == 0
    # The new owner gets every entry again and its acks count, once.
    again = new.poll()
    assert sorted(entry.text for entry in again) == ["m1", "m2", "m3"]
    assert new.settle(again).acked == 3
    assert new.settle(again).acked == 0
    assert client.get(frontier_key) == taken[-1].id.encode()
    new.close()
    old.close()


def test_the_in_flight_cap_holds_across_a_tenants_consumers(gate: Quotagate) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.topics.set_settings(tenant, max_in_flight=5)
    for topic in ("orders", "payments"):
        gate.streams.create_topic(tenant, topic, partitions=1, parallelism=1)
        gate.streams.producer(tenant, topic).send_many([f"{topic}-{i}" for i in range(10)])
    first = gate.streams.consumer(tenant, "orders", "g", "c1", batch=10)
    second = gate.streams.consumer(tenant, "payments", "g", "c2", batch=10)
    held = first.poll()
    assert len(held) == 5
    assert second.poll() == []
    first.settle(held[:3])
    assert len(second.poll()) == 3
    assert first.poll() == []  # still holds 2 of the 5
    first.close()
    second.close()


def test_partitions_are_shared_out_among_live_consumers_up_to_the_parallelism(
    gate: Quotagate,
) -> None:
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=4, parallelism=2)
    consumers = [gate.streams.consumer(tenant, "orders", "g", f"c{index}", lease_ttl=1.0)
                 for index in range(3)]

    def settled() -> bool:
        """Every partition owned, and each consumer owns exactly its share."""
        for consumer in consumers:
            consumer.tick()
        return sorted(p for c in consumers for p in c.owned) == [0, 1, 2, 3] and all(
            set(consumer.owned) == consumer.assigned for consumer in consumers)

    wait_for(settled, "all four partitions owned")
    assert sorted(len(consumer.owned) for consumer in consumers) == [0, 2, 2]
    # One of the two working consumers leaves: the standby one takes its share.
    leaving = next(consumer for consumer in consumers if consumer.owned)
    leaving.close()
    consumers.remove(leaving)
    wait_for(settled, "the standby consumer taking over")
    assert sorted(len(consumer.owned) for consumer in consumers) == [2, 2]
    for consumer in consumers:
        consumer.close()


def test_a_tenant_mapped_to_a_redis_of_its_own(
    gate: Quotagate, client: redis.Redis, tmp_path: Path
) -> None:
    own = RedisServer(tmp_path / "own")
    (tmp_path / "own").mkdir()
    own.start()
    try:
        big, small = tenant_with_quota(gate), tenant_with_quota(gate)
        gate.streams.topics.set_settings(big, redis_url=own.url)
        for tenant in (big, small):
            gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
            gate.streams.producer(tenant, "orders").send_many(["x", "y"])
        own_client = redis.Redis.from_url(own.url)
        assert keys_of(own_client, f"*tenant:{big}:*") and not keys_of(client, f"*tenant:{big}:*")
        assert not keys_of(own_client, f"*tenant:{small}:*")
        own_client.close()
        assert [entry.text for entry in _drain(gate, big, "orders")] == ["x", "y"]
        # The control plane still sees every tenant's topics.
        assert {(spec.tenant, spec.name) for spec in gate.streams.topics.specs()} >= {
            (big, "orders"), (small, "orders")}
        assert gate.streams.status(big, "orders").partitions[0].length == 2
    finally:
        own.kill()


def test_streams_on_a_redis_cluster(tmp_path: Path, redis_cluster: RedisCluster) -> None:
    with fresh_database("sqlite", tmp_path) as db_url, stream_gate(db_url, redis_cluster.url) as gate:
        tenant = tenant_with_quota(gate)
        gate.set_tenant("default", {"partitions": 8, "parallelism": 8})
        for owner in (tenant, "default"):
            gate.streams.create_topic(owner, "orders", partitions=4, parallelism=2)
            gate.streams.producer(owner, "orders").send_many([f"{owner}-{i}" for i in range(40)])
            seen: list[Entry] = []

            def handler(entry: Entry, seen: list[Entry] = seen) -> None:
                if entry.text.endswith("-7") and entry not in seen:
                    seen.append(entry)
                    raise RuntimeError("once")  # redelivered by a fenced claim
                seen.append(entry)

            with gate.streams.consumer(owner, "orders", "g", "c1", visibility_timeout=0.1,
                                       lease_ttl=1.0) as consumer:
                assert consumer.run(handler, until_idle=0.5) == 40
            status = gate.streams.status(owner, "orders")
            assert sum(p.length for p in status.partitions) == 40
            assert all(g.pending == 0 and g.frontier for p in status.partitions for g in p.groups)
        cluster = redis.RedisCluster.from_url(redis_cluster.url.replace("redis+cluster", "redis"))
        tagged = keys_of_cluster(cluster, f"{{tenant:{tenant}:orders}}:*")
        assert len({cluster.keyslot(name) for name in tagged}) == 1 and len(tagged) >= 8
        cluster.close()
        gate.streams.delete_topic(tenant, "orders")


def keys_of_cluster(cluster: redis.RedisCluster, pattern: str) -> list[str]:
    return sorted(name.decode() for name in cluster.keys(pattern, target_nodes=cluster.ALL_NODES))


def test_deleting_a_topic_stops_its_consumers_and_generations_carry_on(
    gate: Quotagate, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quotagate.streams import consumer as consumer_module

    monkeypatch.setattr(consumer_module, "RESOLVE_EVERY", 0.0)
    tenant = tenant_with_quota(gate)
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    gate.streams.producer(tenant, "orders").send("m")
    running = gate.streams.consumer(tenant, "orders", "g", "c1")
    assert [entry.text for entry in running.poll()] == ["m"]
    assert running.owned[0].lease.generation == 1
    gate.streams.delete_topic(tenant, "orders")
    with pytest.raises(NotFound):
        running.tick()
    stream = StreamKeys(tenant).partition("orders", 0)
    assert not client.exists(stream)  # not recreated by the consumer's reads
    # The same topic created again: its partition leases go on from the old generation.
    gate.streams.create_topic(tenant, "orders", partitions=1, parallelism=1)
    with gate.streams.consumer(tenant, "orders", "g", "c1") as again:
        again.tick()
        assert again.owned[0].lease.generation == 2


def test_a_deleted_topics_leases_go_and_its_consumers_stay_fenced_in_one_made_again(
    gate: Quotagate, client: redis.Redis
) -> None:
    tenant = tenant_with_quota(gate)
    keys = StreamKeys(tenant)
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    gate.streams.producer(tenant, "orders").send_many(["a", "b", "c", "d"])
    # A consumer of the old topic that will not notice the delete (a paused process).
    stale = gate.streams.consumer(tenant, "orders", "g", "c1")
    assert len(stale.poll()) == 4
    assert {owned.lease.generation for owned in stale.owned.values()} == {1}
    gate.streams.delete_topic(tenant, "orders")
    assert not any(client.exists(keys.lease("orders", "g", partition)) for partition in range(2))
    # Of the topic's keys only its lease floor is left: one key, whatever the groups and
    # partitions were, and the highest generation they reached.
    assert keys_of(client, f"*tenant:{tenant}:orders}}*") == [keys.lease_floor("orders")]
    assert client.get(keys.lease_floor("orders")) == b"1"

    # The same topic made again, read by a consumer of the same name.
    gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
    gate.streams.producer(tenant, "orders").send_many(["e", "f"])
    with gate.streams.consumer(tenant, "orders", "g", "c1") as fresh:
        entries = fresh.poll()
        assert sorted(entry.text for entry in entries) == ["e", "f"]
        assert {owned.lease.generation for owned in fresh.owned.values()} == {2}
        # The old consumer's acks of the new topic's entries are refused and change nothing.
        refused = stale.settle(entries)
        assert refused.acked == 0 and len(refused.refused) == len(
            {entry.partition for entry in entries})
        assert sum(client.xpending(keys.partition("orders", partition), "g")["pending"]
                   for partition in range(2)) == 2
        assert not any(client.exists(keys.frontier("orders", "g", partition))
                       for partition in range(2))
        assert fresh.settle(entries).acked == 2
    gate.streams.delete_topic(tenant, "orders")
    assert client.get(keys.lease_floor("orders")) == b"2"
    assert keys_of(client, f"*tenant:{tenant}:orders}}*") == [keys.lease_floor("orders")]
