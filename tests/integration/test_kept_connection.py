"""The one kept connection (store/kept_connection.py, docs/decisions/245): across fork and close.

Admission's pooled keeper is checked here for what it shares with the rate store's autocommit
one (whose own tests are test_rate_sql_held_connection.py): a forked child leaves the
parent's session alone, and nothing is kept after ``close``. Every test runs on SQLite,
PostgreSQL and MariaDB.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate.store.driver import DriverTransaction, run_driver_transaction
from quotagate.store.engine import create_engine
from quotagate.store.kept_connection import KeptConnection
from support.databases import fresh_database

_SESSION = {
    "sqlite": "SELECT 1",  # an SQLite file has no server session: the connection is the check
    "postgresql": "SELECT pg_backend_pid()",
    "mysql": "SELECT CONNECTION_ID()",
}


@pytest.fixture(params=("sqlite", "postgresql", "mysql"))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as database_url:
        yield database_url


def _session(transaction: DriverTransaction) -> tuple[int, int]:
    """(the DBAPI connection, the server's session) the transaction ran on."""
    row = transaction.rows(sa.text(_SESSION[transaction.dialect.name]), {})[0]
    return id(transaction._cursor.connection), int(row[0])


def _admit_in_child(engine: Any, kept: KeptConnection, results: Any) -> None:
    try:
        connection, _session_id = run_driver_transaction(engine, _session, kept=kept)
        kept.close()  # must not close what the parent still uses
        results.put(("ok", connection))
    except BaseException as error:  # reported in the parent
        results.put(("error", repr(error)))


def test_a_forked_child_runs_on_its_own_connection_and_leaves_the_parents_kept_one_alone(
    url: str,
) -> None:
    engine = create_engine(url)
    kept = KeptConnection(engine)
    try:
        parent = run_driver_transaction(engine, _session, kept=kept)
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        child = context.Process(target=_admit_in_child, args=(engine, kept, results), daemon=True)
        child.start()
        answer = results.get(timeout=60)
        child.join(timeout=60)
        assert answer[0] == "ok" and child.exitcode == 0, answer
        # The child ran on a connection of its own: the parent's object is the one it kept.
        assert answer[1] != parent[0]
        # The parent goes on on the same connection and server session, which still works.
        assert run_driver_transaction(engine, _session, kept=kept) == parent
    finally:
        kept.close()
        engine.dispose()


def test_nothing_is_kept_after_close(url: str) -> None:
    engine = create_engine(url)
    kept = KeptConnection(engine)
    try:
        run_driver_transaction(engine, _session, kept=kept)
        assert engine.pool.checkedout() == 1  # kept
        kept.close()
        assert engine.pool.checkedout() == 0
        run_driver_transaction(engine, _session, kept=kept)  # still runs, through the pool
        assert engine.pool.checkedout() == 0  # and is not kept by a closed keeper
    finally:
        engine.dispose()
