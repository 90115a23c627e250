"""The SQL rate store's held connection: reads first only as a hint, survives fork and a dropped session.

Every test runs on SQLite, PostgreSQL and MariaDB (the server ones skip, or
fail with CI=true, when the server is missing).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate.domain.bucket import BucketConfig
from quotagate.rate.keys import BucketKey
from quotagate.rate.sql import SqlRateStore
from quotagate.rate.stores import rate_store_from_url
from quotagate.store import kept_connection
from quotagate.store.engine import create_engine
from support.databases import fresh_database
from support.waiting import wait_for

COUNTING = BucketConfig(5, 0)


@pytest.fixture(params=("sqlite", "postgresql", "mysql"))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as database_url:
        yield database_url


def _store(url: str) -> SqlRateStore:
    store = rate_store_from_url(url)
    assert isinstance(store, SqlRateStore)
    return store


def test_a_bucket_expected_to_refuse_still_grants_after_a_top_up_made_elsewhere(url: str) -> None:
    mine, elsewhere = _store(url), _store(url)  # two processes' stores, in effect
    key, shape = BucketKey("topped-up"), BucketConfig(1, 0)
    try:
        mine.configure(key, shape, fresh=True)
        assert mine.take(key, shape).granted
        refused = mine.take(key, shape)  # no refill: this store now reads first for good
        assert (refused.granted, refused.remaining, refused.retry_after) == (False, 0, None)
        assert elsewhere.add(key, shape, 1) == 1
        granted = mine.take(key, shape)
        assert (granted.granted, granted.remaining) == (True, 0)
        assert not mine.take(key, shape).granted
        assert elsewhere.peek(key, shape) == 0
    finally:
        mine.close()
        elsewhere.close()


def _take_in_child(store: SqlRateStore, key: BucketKey, results: Any) -> None:
    try:
        decision = store.take(key, COUNTING)
        store.close()  # must not close what the parent still uses
        results.put(("ok", decision.granted))
    except BaseException as error:  # reported in the parent
        results.put(("error", repr(error)))


def test_a_forked_child_takes_on_its_own_connection_and_leaves_the_parents_alone(url: str) -> None:
    store = _store(url)
    key = BucketKey("forked")
    try:
        store.configure(key, COUNTING, fresh=True)
        assert store.take(key, COUNTING).granted  # the parent's held connection is open
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        child = context.Process(target=_take_in_child, args=(store, key, results), daemon=True)
        child.start()
        answer = results.get(timeout=60)
        child.join(timeout=60)
        assert answer == ("ok", True) and child.exitcode == 0
        # The parent goes on at once (no idle ping): its session must still be there.
        decisions = [store.take(key, COUNTING) for _ in range(4)]
        assert [decision.granted for decision in decisions] == [True, True, True, False]
    finally:
        store.close()


def _drop_other_sessions(url: str) -> None:
    """End every session on ``url``'s database but the caller's, and wait until they are gone."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    database = sa.engine.make_url(url).database
    if engine.dialect.name == "postgresql":
        others = ("SELECT pid FROM pg_stat_activity WHERE datname = :database "
                  "AND pid <> pg_backend_pid()")
        end = "SELECT pg_terminate_backend({})"
    else:
        others = ("SELECT id FROM information_schema.processlist WHERE db = :database "
                  "AND id <> CONNECTION_ID()")
        end = "KILL {}"
    try:
        with engine.connect() as connection:
            sessions = connection.execute(sa.text(others), {"database": database}).scalars().all()
            assert sessions, "the store holds a session"
            for session in sessions:
                connection.exec_driver_sql(end.format(int(session)))
            wait_for(lambda: not connection.execute(
                sa.text(others), {"database": database}).first(), "the sessions to end")
    finally:
        engine.dispose()


def test_a_held_connection_the_server_dropped_is_replaced_before_the_next_take(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if url.startswith("sqlite"):
        pytest.skip("an SQLite file has no session to drop")
    monkeypatch.setattr(kept_connection, "PING_AFTER_IDLE", 0.0)  # every take counts as after idle
    store = _store(url)
    key = BucketKey("dropped")
    try:
        store.configure(key, COUNTING, fresh=True)
        assert store.take(key, COUNTING).granted
        _drop_other_sessions(url)
        decisions = [store.take(key, COUNTING) for _ in range(5)]
        assert [decision.granted for decision in decisions] == [True] * 4 + [False]
    finally:
        store.close()
