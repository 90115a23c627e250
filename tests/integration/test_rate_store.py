"""One behavioural suite for every rate store: SQLite, PostgreSQL, MariaDB and Redis.

Redis runs as a throwaway ``redis-server`` of these tests' own, on a free
port (``support.redis_servers``), so flushing and restarting it disturbs
nobody else's Redis.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quotagate.domain.bucket import BucketConfig
from quotagate.errors import NotFound, StoreUnavailable
from quotagate.rate.backend import RateStore, Take
from quotagate.rate.keys import BucketKey
from quotagate.rate.redis import SCRIPT_SHA, RedisRateStore
from quotagate.rate.sql import SqlRateStore
from quotagate.rate.stores import rate_store_from_url
from support.databases import fresh_database
from support.redis_servers import RedisCluster, RedisServer

STORES = ("sqlite", "postgresql", "mysql", "redis")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RateStore]:
    if request.param == "redis":
        # Asked for here, not as an argument: without redis-server only the
        # Redis cases skip (fail with CI=true), the SQL ones still run.
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        redis_store = rate_store_from_url(redis_server.url)
        assert isinstance(redis_store, RedisRateStore)
        redis_store.client.flushall()
        yield redis_store
        redis_store.close()
        return
    with fresh_database(request.param, tmp_path) as url:
        sql_store = rate_store_from_url(url)
        assert isinstance(sql_store, SqlRateStore)
        yield sql_store
        sql_store.close()


COUNTING = BucketConfig(5, 0)


# Every member of the port, each exercised below. A member added to RateStore
# and not here fails the test: a backend must be held to all of it.
PORT = {"description", "configure", "take", "take_many", "add", "peek", "forget", "close"}


def test_every_store_implements_the_whole_port(store: RateStore) -> None:
    members = {name for name in vars(RateStore) if not name.startswith("_")}
    assert members == PORT
    assert isinstance(store.description, str) and store.description
    key, other = BucketKey("port-a"), BucketKey("port-b")
    assert store.configure(key, COUNTING, fresh=True) == 5
    assert store.configure(other, COUNTING, fresh=True) == 5
    taken = store.take(key, COUNTING, 2)
    assert (taken.granted, taken.remaining) == (True, 3)
    refused = store.take(key, COUNTING, 4)  # all or none
    assert (refused.granted, refused.remaining) == (False, 3)
    decisions = store.take_many([Take(key, COUNTING, 1), Take(other, COUNTING, 6),
                                 Take(other, COUNTING, 5)])
    assert [(decision.granted, decision.remaining) for decision in decisions] == [
        (True, 2), (False, 5), (True, 0)]
    assert store.add(key, COUNTING, 10) == 5  # never above capacity
    assert store.peek(key, COUNTING) == 5 and store.peek(other, COUNTING) == 0
    # Reshaping keeps the tokens (capped); fresh=True starts full.
    assert store.configure(key, BucketConfig(3, 0), fresh=False) == 3
    assert store.add(other, COUNTING, 5) == 5
    store.forget(other)
    # Forgotten: its five tokens are gone. (The SQL stores then call the bucket
    # not configured; Redis treats it as empty. Either way nothing is granted.)
    try:
        granted = store.take(other, COUNTING, 1).granted
    except NotFound:
        granted = False
    assert not granted
    assert store.configure(other, COUNTING, fresh=True) == 5


def test_six_threads_two_tenants_three_requests_five_tokens(store: RateStore) -> None:
    """Exactly 3 grants per tenant, 2 tokens left each, no interference."""
    tenants = [BucketKey("tenant-a"), BucketKey("tenant-b")]
    for key in tenants:
        store.configure(key, COUNTING, fresh=True)
    barrier = threading.Barrier(6)
    granted: dict[str, int] = {"tenant-a": 0, "tenant-b": 0}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def request(key: BucketKey) -> None:
        try:
            barrier.wait(timeout=30)
            decision = store.take(key, COUNTING)
            with lock:
                granted[key.tenant] += decision.granted
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=request, args=(key,)) for key in tenants for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert granted == {"tenant-a": 3, "tenant-b": 3}
    assert [store.peek(key, COUNTING) for key in tenants] == [2, 2]


def test_concurrent_takes_never_spend_a_token_twice(store: RateStore) -> None:
    key = BucketKey("team-a")
    store.configure(key, BucketConfig(10, 0), fresh=True)
    results: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            decision = store.take(key, BucketConfig(10, 0))
            with lock:
                results.append(decision.granted)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 30
    assert sum(results) == 10
    assert store.peek(key, BucketConfig(10, 0)) == 0


def test_take_is_all_or_nothing_and_says_when_to_come_back(store: RateStore) -> None:
    key = BucketKey("team-a")
    config = BucketConfig(5, 0)
    store.configure(key, config, fresh=True)
    assert store.take(key, config, 3).granted
    refused = store.take(key, config, 3)
    assert not refused.granted
    assert refused.remaining == 2
    assert refused.retry_after is None  # no refill: only a top-up helps
    assert store.peek(key, config) == 2
    assert store.add(key, config, 1) == 3
    assert store.take(key, config, 3).granted


def test_top_up_never_exceeds_capacity(store: RateStore) -> None:
    key = BucketKey("team-a")
    store.configure(key, COUNTING, fresh=True)
    assert store.take(key, COUNTING).granted
    assert store.add(key, COUNTING, 100) == 5


def test_refill_uses_the_stores_clock(store: RateStore) -> None:
    key = BucketKey("team-a")
    config = BucketConfig(3, 50)
    store.configure(key, config, fresh=True)
    assert store.take(key, config, 3).granted
    refused = store.take(key, config, 3)
    assert not refused.granted
    assert refused.retry_after is not None and 0 < refused.retry_after <= 3 / 50
    deadline = time.monotonic() + 10
    while not store.take(key, config, 3).granted:
        assert time.monotonic() < deadline, "the bucket never refilled"
        time.sleep(0.01)


def test_reshaping_keeps_tokens_and_caps_them_at_the_new_capacity(store: RateStore) -> None:
    key = BucketKey("team-a")
    store.configure(key, BucketConfig(10, 0), fresh=True)
    assert store.take(key, BucketConfig(10, 0), 4).granted
    # Re-applying a shape must not hand out a fresh bucket.
    assert store.configure(key, BucketConfig(10, 0), fresh=False) == 6
    assert store.configure(key, BucketConfig(3, 0), fresh=False) == 3
    assert store.configure(key, BucketConfig(8, 0), fresh=False) == 3
    assert store.configure(key, BucketConfig(8, 0), fresh=True) == 8


def test_take_many_decides_each_take_on_its_own(store: RateStore) -> None:
    first, second = BucketKey("team-a"), BucketKey("default", "orders")
    store.configure(first, BucketConfig(2, 0), fresh=True)
    store.configure(second, BucketConfig(5, 0), fresh=True)
    decisions = store.take_many([
        Take(first, BucketConfig(2, 0), 1),
        Take(second, BucketConfig(5, 0), 4),
        Take(first, BucketConfig(2, 0), 1),
        Take(first, BucketConfig(2, 0), 1),
        Take(second, BucketConfig(5, 0), 2),
    ])
    assert [decision.granted for decision in decisions] == [True, True, True, False, False]
    assert [decision.remaining for decision in decisions] == [1, 1, 0, 0, 1]


def test_buckets_of_different_tenants_and_topics_are_independent(store: RateStore) -> None:
    keys = [BucketKey("team-a"), BucketKey("team-a", "orders"), BucketKey("team-b"),
            BucketKey("default")]
    for key in keys:
        store.configure(key, COUNTING, fresh=True)
    assert store.take(keys[0], COUNTING, 5).granted
    assert [store.peek(key, COUNTING) for key in keys] == [0, 5, 5, 5]
    store.forget(keys[1])
    assert [store.peek(key, COUNTING) for key in (keys[0], keys[2], keys[3])] == [0, 5, 5]


def test_redis_keys_are_namespaced_per_tenant(redis_server: RedisServer) -> None:
    store = rate_store_from_url(redis_server.url)
    assert isinstance(store, RedisRateStore)
    store.client.flushall()
    for key in (BucketKey("default"), BucketKey("default", "orders"), BucketKey("team-a"),
                BucketKey("team-a", "orders")):
        store.configure(key, COUNTING, fresh=True)
    assert sorted(name.decode() for name in store.client.keys("*")) == [
        "quotagate:rate:bucket",
        "quotagate:rate:bucket:orders",
        "tenant:{team-a}:quotagate:rate:bucket",
        "tenant:{team-a}:quotagate:rate:bucket:orders",
    ]
    store.close()


def test_redis_script_is_loaded_once_and_reloaded_after_a_flush(
    redis_server: RedisServer,
) -> None:
    store = rate_store_from_url(redis_server.url)
    assert isinstance(store, RedisRateStore)
    store.client.flushall()
    store.client.script_flush()
    key = BucketKey("team-a")
    store.configure(key, COUNTING, fresh=True)
    assert store.client.script_exists(SCRIPT_SHA) == [True]
    assert store.take(key, COUNTING).granted
    store.client.script_flush()  # as a restarted or failed-over server would have it
    assert store.take(key, COUNTING).granted
    assert store.client.script_exists(SCRIPT_SHA) == [True]
    store.close()


def test_redis_cluster_takes_and_batches_across_slots(redis_cluster: RedisCluster) -> None:
    store = rate_store_from_url(redis_cluster.url)
    assert isinstance(store, RedisRateStore) and store.cluster
    keys = [BucketKey(tenant, topic) for tenant in ("default", "team-a", "team-b", "team-c")
            for topic in (None, "orders")]
    for key in keys:
        store.configure(key, COUNTING, fresh=True)
    # Three rounds of 2 tokens from every bucket, in one call: 2, 2, then refused.
    decisions = store.take_many([Take(key, COUNTING, 2) for key in keys] * 3)
    assert [decision.granted for decision in decisions] == [True] * 16 + [False] * 8
    assert [store.peek(key, COUNTING) for key in keys] == [1] * 8
    slots = {store.client.keyslot(name.decode()) for name in store.client.keys(
        "tenant:{team-a}:*", target_nodes=store.client.ALL_NODES)}
    assert len(slots) == 1
    store.close()


@pytest.mark.parametrize("cause", ["a server without cluster mode", "nothing listening"])
def test_a_cluster_url_nobody_answers_as_a_cluster_is_rate_store_unavailable(
    redis_server: RedisServer, cause: str
) -> None:
    # redis-py raises RedisClusterException, which is no RedisError, for both.
    with socket.socket() as bound_not_listening:  # a port that refuses connections
        bound_not_listening.bind(("127.0.0.1", 0))
        port = redis_server.port if cause == "a server without cluster mode" \
            else int(bound_not_listening.getsockname()[1])
        with pytest.raises(StoreUnavailable) as refused:
            rate_store_from_url(f"redis+cluster://:secret-word@127.0.0.1:{port}/0")
    assert refused.value.code == "rate_store_unavailable"
    assert "cannot be reached" in str(refused.value) and "secret-word" not in str(refused.value)
