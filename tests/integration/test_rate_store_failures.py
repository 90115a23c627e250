"""Every way Redis fails is a 503 ``rate_store_unavailable``, and none stalls the ledger.

Against real servers of the tests' own: a ``redis-server`` on a free port made
to fail (a key of the wrong type, a read-only replica, out of memory, killed)
and a TCP port that accepts connections and never answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from quotagate import NotFound, Quotagate
from quotagate.domain.bucket import BucketConfig
from quotagate.errors import InvalidInput, QuotagateError, StoreUnavailable
from quotagate.rate.keys import BucketKey, redis_key
from quotagate.rate.redis import RedisRateStore
from quotagate.rate.stores import rate_store_from_url
from quotagate.store.redis_client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT
from quotagate.streams.connection import StreamRedis
from support.redis_servers import RedisServer, SilentServer

COUNTING = BucketConfig(5, 0)
KEY = BucketKey("team-a")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test alone: it is made read-only, full or killed."""
    server = RedisServer(tmp_path / "redis")
    server.directory.mkdir()
    server.start()
    yield server
    server.kill()


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("path", ["x", "9/extra", "db0"])
def test_a_redis_database_that_is_not_a_number_is_refused(path: str) -> None:
    # redis-py reads a path it cannot parse as database 0: the buckets went there silently.
    with pytest.raises(InvalidInput) as refused:
        rate_store_from_url(f"redis://:secret-word@127.0.0.1:1/{path}")
    assert refused.value.code == "invalid_rate_store_url"
    assert f"got {path!r}" in str(refused.value) and "secret-word" not in str(refused.value)
    assert isinstance(rate_store_from_url("redis://127.0.0.1:1/12"), RedisRateStore)


def test_clients_get_short_timeouts_by_default_and_from_the_url() -> None:
    default = rate_store_from_url("redis://127.0.0.1:1/0")
    assert isinstance(default, RedisRateStore)
    options = default.client.connection_pool.connection_kwargs
    assert (options["socket_connect_timeout"], options["socket_timeout"]) == (
        DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT)
    assert DEFAULT_TIMEOUT <= 5
    chosen = rate_store_from_url("redis://127.0.0.1:1/0?socket_timeout=0.25"
                                 "&socket_connect_timeout=0.5")
    assert isinstance(chosen, RedisRateStore)
    options = chosen.client.connection_pool.connection_kwargs
    assert (options["socket_connect_timeout"], options["socket_timeout"]) == (0.5, 0.25)
    # The stream layer's client is built by the same helper.
    streams = StreamRedis.from_url("redis://127.0.0.1:1/0?socket_timeout=0.25")
    assert streams.client.connection_pool.connection_kwargs["socket_timeout"] == 0.25
    for each in (default, chosen, streams):
        each.close()


def test_a_redis_that_never_answers_times_out_as_503(silent_redis: SilentServer) -> None:
    store = rate_store_from_url(silent_redis.url("socket_timeout=0.2"))
    with pytest.raises(StoreUnavailable) as failure:
        store.take(KEY, COUNTING)
    assert failure.value.code == "rate_store_unavailable"
    assert failure.value.status == 503
    assert "did not answer in time" in failure.value.message
    store.close()


def wrong_type(server: RedisServer) -> None:
    redis.Redis.from_url(server.url).set(redis_key(KEY), "not a bucket")


def read_only(server: RedisServer) -> None:
    # A replica of a primary that is not there: it refuses every write with READONLY.
    redis.Redis.from_url(server.url).replicaof("127.0.0.1", closed_port())


def out_of_memory(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)


def killed(server: RedisServer) -> None:
    server.kill()


FAILURES: dict[str, tuple[Callable[[RedisServer], None], str]] = {
    "WRONGTYPE": (wrong_type, "WRONGTYPE"),
    "READONLY": (read_only, "READONLY"),
    "OOM": (out_of_memory, "OOM"),
    "connection refused": (killed, "cannot be reached"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_every_redis_failure_is_503_and_the_request_is_not_recorded(
    db_url: str, own_redis: RedisServer, failure: str
) -> None:
    with Quotagate.connect(db_url, rate_store=own_redis.url) as gate:
        gate.set_pool("pool-1", {"gpu": 10})
        gate.set_tenant("team-a", {"gpu": 10})
        gate.set_rate("team-a", {"capacity": 5, "refill_per_second": 0})
        assert gate.submit("job-1", "team-a", {"gpu": 1}).created
        cause, words = FAILURES[failure]
        cause(own_redis)
        with pytest.raises(QuotagateError) as refused:
            gate.submit("job-2", "team-a", {"gpu": 1})
        assert isinstance(refused.value, StoreUnavailable), refused.value
        assert (refused.value.status, refused.value.code) == (503, "rate_store_unavailable")
        assert words in refused.value.message
        with pytest.raises(NotFound):
            gate.show("job-2")
        # Tenants without a bucket do not touch Redis and are still served.
        gate.set_tenant("team-b", {"gpu": 10})
        assert gate.submit("job-3", "team-b", {"gpu": 1}).created
        assert gate.check_invariants() == []


def test_a_silent_redis_stalls_only_its_own_caller_not_the_ledger_writers(
    db_url: str, own_redis: RedisServer, silent_redis: SilentServer
) -> None:
    with Quotagate.connect(db_url, rate_store=own_redis.url) as setup:
        setup.set_pool("pool-1", {"gpu": 10})
        for tenant in ("team-a", "team-b"):
            setup.set_tenant(tenant, {"gpu": 10})
        setup.set_rate("team-a", {"capacity": 5, "refill_per_second": 0})
    # The bucket's shape is in the ledger; its tokens now in a Redis that never answers,
    # with a read timeout far longer than this test: only hanging up ends the take.
    with Quotagate.connect(db_url, rate_store=silent_redis.url("socket_timeout=600")) as gate:
        outcome: list[BaseException | None] = []

        def submit_limited() -> None:
            try:
                gate.submit("job-limited", "team-a", {"gpu": 1})
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        stuck = threading.Thread(target=submit_limited)
        stuck.start()
        silent_redis.wait_for_bytes(1)  # the take is on the wire, waiting for an answer
        # Meanwhile every other writer goes on: on SQLite this needs the write lock
        # that the take used to hold (busy timeout 30 s, far below the read timeout).
        assert gate.submit("job-unlimited", "team-b", {"gpu": 1}).created
        assert gate.admit_until_idle() == 1
        assert stuck.is_alive()
        silent_redis.hang_up()
        stuck.join(timeout=60)
        assert not stuck.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable), outcome
        assert outcome[0].code == "rate_store_unavailable"
        with pytest.raises(NotFound):
            gate.show("job-limited")
        assert gate.check_invariants() == []


def test_a_restarted_redis_is_reconnected_at_the_next_take(own_redis: RedisServer) -> None:
    store = rate_store_from_url(own_redis.url)
    store.configure(KEY, COUNTING, fresh=True)
    assert store.take(KEY, COUNTING).granted  # leaves an idle connection to the old process
    own_redis.restart()
    # The idle connection is broken: replaced once, silently. The state went with the
    # old process, so the bucket restarts empty (it never grants what it forgot).
    decision = store.take(KEY, COUNTING)
    assert not decision.granted and decision.remaining == 0
    store.close()


def test_shaping_a_bucket_in_a_silent_redis_stalls_only_the_admin(
    db_url: str, silent_redis: SilentServer
) -> None:
    with Quotagate.connect(db_url, rate_store=silent_redis.url("socket_timeout=600")) as gate:
        gate.set_pool("pool-1", {"gpu": 10})
        for tenant in ("team-a", "team-b"):
            gate.set_tenant(tenant, {"gpu": 10})
        outcome: list[BaseException | None] = []

        def shape() -> None:
            try:
                gate.set_rate("team-a", {"capacity": 5, "refill_per_second": 0})
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        admin = threading.Thread(target=shape)
        admin.start()
        silent_redis.wait_for_bytes(1)  # the configure is on the wire
        assert gate.submit("job-1", "team-b", {"gpu": 1}).created  # the write lock is free
        assert gate.rate_status("team-a") is None  # and nothing of the shape is written yet
        silent_redis.hang_up()
        admin.join(timeout=60)
        assert not admin.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable), outcome
        assert gate.rate_status("team-a") is None  # the shape was not recorded either


def test_removing_a_bucket_while_redis_is_down_still_removes_it(
    db_url: str, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with Quotagate.connect(db_url, rate_store=own_redis.url) as gate:
        gate.set_pool("pool-1", {"gpu": 10})
        gate.set_tenant("team-a", {"gpu": 10})
        gate.set_rate("team-a", {"capacity": 1, "refill_per_second": 0})
        assert gate.submit("job-1", "team-a", {"gpu": 1}).created
        own_redis.kill()
        # The shape in the ledger is what limits the tenant: removing it needs no Redis.
        assert gate.set_rate("team-a", None) is None
        assert gate.rate_status("team-a") is None
        assert gate.submit("job-2", "team-a", {"gpu": 1}).created
    # One line that says why, no traceback under a removal that succeeded.
    [warning] = [record for record in caplog.records if "was removed" in record.getMessage()]
    assert warning.exc_info is None and "cannot be reached" in warning.getMessage()
