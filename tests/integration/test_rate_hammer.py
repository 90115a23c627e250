"""Real processes against real stores: grants never exceed capacity + refill x elapsed.

And Redis, killed with its state mid-run (no persistence), restarts every
bucket empty: it may lose the tokens it held, it never hands out a fresh bucket.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import Quotagate, RateLimited, RequestState, StoreUnavailable
from quotagate.domain.bucket import BucketConfig
from quotagate.rate.keys import BucketKey
from quotagate.rate.redis import RedisRateStore
from quotagate.rate.stores import rate_store_from_url
from quotagate.store import schema
from support.databases import fresh_database
from support.redis_servers import RedisServer

PROCESSES = 4
KEY = BucketKey("team-a")
# Refill slow next to the capacity: a restart that handed out a fresh bucket
# would exceed the bound by far more than the tokens a short outage costs.
CONFIG = BucketConfig(capacity=20, refill_per_second=10)
# SQLite's clock has millisecond resolution; everything else is finer.
CLOCK_SLACK = 0.01


def _take_until(url: str, go: Any, stop: Any, started: Any, results: Any) -> None:
    """Take 1-3 tokens at a time until told to stop; report tokens granted and attempts."""
    store = rate_store_from_url(url)
    granted = attempts = errors = 0
    started.put(1)
    go.wait()
    try:
        while not stop.is_set():
            amount = 1 + attempts % 3
            attempts += 1
            try:
                decision = store.take(KEY, CONFIG, amount)
            except StoreUnavailable:
                errors += 1  # Redis is being restarted: refuse, as the gate does
                time.sleep(0.005)
                continue
            granted += amount if decision.granted else 0
    finally:
        store.close()
    results.put((granted, attempts, errors))


def _submit_until(
    url: str, prefix: str, go: Any, stop: Any, started: Any, results: Any
) -> None:
    attempts = 0
    with Quotagate.connect(url) as gate:
        started.put(1)
        go.wait()
        while not stop.is_set():
            with contextlib.suppress(RateLimited):
                gate.submit(f"{prefix}-{attempts}", "team-a", {"gpu": 1})
            attempts += 1
    results.put(attempts)


class Hammer:
    """PROCESSES real processes running ``target`` from :meth:`start` until :meth:`stop`.

    The processes start (slowly: spawn) first and begin together on a signal, so
    that the bound is judged from then: however long they took to start, the
    bucket held at most its capacity when they began.
    """

    def __init__(self, target: Any, arguments: Callable[[int], tuple[Any, ...]]) -> None:
        # A fork server that has imported the drivers once makes each process cheap
        # to start (spawn would import SQLAlchemy and the drivers in every one).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["quotagate.app", "quotagate.rate.redis", "psycopg",
                                        "pymysql", "redis", "test_rate_hammer"])
        self.go = context.Event()
        self.stop_event = context.Event()
        self.started = context.Queue()
        self.results = context.Queue()
        self.processes = [
            context.Process(
                target=target,
                args=(*arguments(index), self.go, self.stop_event, self.started, self.results),
            )
            for index in range(PROCESSES)
        ]

    def start(self) -> float:
        """Start the processes, let them go together; return when they went."""
        for process in self.processes:
            process.start()
        for _ in self.processes:
            self.started.get(timeout=120)
        went = time.time()
        self.go.set()
        return went

    def stop(self) -> list[Any]:
        self.stop_event.set()
        outcomes = [self.results.get(timeout=120) for _ in self.processes]
        for process in self.processes:
            process.join(timeout=60)
            assert process.exitcode == 0
        return outcomes


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(params=["sqlite", "postgresql", "mysql", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "redis":
        # Only the Redis case needs redis-server; the SQL cases run without it.
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        yield redis_server.url
        return
    with fresh_database(request.param, tmp_path) as url:
        yield url


def _bound(started: float) -> float:
    elapsed = time.time() - started + CLOCK_SLACK
    return CONFIG.capacity + CONFIG.refill_per_second * elapsed


def test_processes_never_take_more_than_capacity_plus_refill(store_url: str) -> None:
    store = rate_store_from_url(store_url)
    hammer = Hammer(_take_until, lambda index: (store_url,))
    store.configure(KEY, CONFIG, fresh=True)
    started = hammer.start()
    time.sleep(1.0)  # the run's length only; nothing is judged by it
    outcomes = hammer.stop()
    bound = _bound(started)
    store.close()
    granted = sum(outcome[0] for outcome in outcomes)
    attempts = sum(outcome[1] for outcome in outcomes)
    assert granted <= bound
    # The bucket starts full and only grows: the first takes cannot all be refused.
    assert granted >= min(CONFIG.capacity - 2, attempts)


def test_processes_submitting_never_get_more_accepted_than_the_bucket_allows(
    db_url: str,
) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 10**6})
        gate.set_tenant("team-a", {"gpu": 10**6})
        hammer = Hammer(_submit_until, lambda index: (db_url, f"p{index}"))
        gate.set_rate("team-a", CONFIG.to_dict())
        started = hammer.start()
        time.sleep(1.0)
        attempts = sum(hammer.stop())
        bound = _bound(started)
        with gate.engine.connect() as connection:
            states = dict(connection.execute(
                sa.select(schema.request.c.state, sa.func.count()).group_by(schema.request.c.state)
            ).all())
    accepted = states.get(RequestState.WAITING.value, 0)
    assert accepted <= bound
    assert accepted >= min(CONFIG.capacity, attempts)
    # Every refused submission left a visible trace.
    assert accepted + states.get(RequestState.REJECTED.value, 0) == attempts


def test_redis_restart_loses_held_tokens_but_never_refills_the_bucket(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        store = rate_store_from_url(server.url)
        counting = BucketConfig(10, 0)
        store.configure(KEY, counting, fresh=True)
        assert store.take(KEY, counting, 4).granted
        server.kill()
        with pytest.raises(StoreUnavailable):
            store.take(KEY, counting)
        server.start()
        # The 6 tokens held at the crash are lost (the loss is bounded by the capacity)...
        refused = store.take(KEY, counting)
        assert not refused.granted
        assert store.peek(KEY, counting) == 0
        # ...and a top-up works as before: exactly the tokens added, no more.
        store.add(KEY, counting, 3)
        assert [store.take(KEY, counting).granted for _ in range(4)] == [True] * 3 + [False]
        store.close()
    finally:
        server.kill()


def test_redis_down_means_submissions_are_refused_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with fresh_database("sqlite", tmp_path) as url, Quotagate.connect(
            url, rate_store=server.url
        ) as gate:
            gate.set_pool("pool-1", {"gpu": 10})
            gate.set_tenant("team-a", {"gpu": 10})
            gate.set_rate("team-a", "capacity=5,refill=0")
            server.kill()
            with pytest.raises(StoreUnavailable):
                gate.submit("job-1", "team-a", {"gpu": 1})
            assert gate.inspect()["requests"] == []
            server.start()
            # Restarted empty: the tenant is limited (not unlimited) until a top-up.
            with pytest.raises(RateLimited):
                gate.submit("job-1", "team-a", {"gpu": 1})
            gate.add_tokens("team-a", 1)
            assert gate.submit("job-1", "team-a", {"gpu": 1}).created
    finally:
        server.kill()


def test_redis_killed_mid_hammer_never_over_grants_and_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        store = rate_store_from_url(server.url)
        assert isinstance(store, RedisRateStore)
        hammer = Hammer(_take_until, lambda index: (server.url,))
        store.configure(KEY, CONFIG, fresh=True)
        started = hammer.start()
        time.sleep(0.5)
        server.restart()  # SIGKILL: every bucket's state is gone
        deadline = time.monotonic() + 30
        while True:  # the store answers again (granted or not) while the hammer runs
            try:
                store.take(KEY, CONFIG)
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the store never answered after the restart"
                time.sleep(0.01)
        outcomes = hammer.stop()
        # Recovery needs no admin: the bucket refills from empty at its rate. Judged
        # with the hammer stopped, which would otherwise take every token as it accrues.
        while not store.take(KEY, CONFIG).granted:
            assert time.monotonic() < deadline, "the bucket never recovered after the restart"
            time.sleep(0.01)
        bound = _bound(started)
        store.close()
        # A restart that refilled the bucket would add a whole capacity on top.
        granted = sum(outcome[0] for outcome in outcomes) + 1
        assert granted <= bound
    finally:
        server.kill()
