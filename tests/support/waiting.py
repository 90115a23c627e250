"""Waiting on a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
# How often to poll lock_waiters on MariaDB: slower than its innodb_trx cache refresh.
LOCK_POLL_SECONDS = 0.2


def wait_for(
    condition: Callable[[], T | None], what: str, timeout: float = 30.0, interval: float = 0.05
) -> T:
    """Poll ``condition`` every ``interval`` seconds until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def lock_waiters(engine: Any) -> int:
    """Transactions of ``engine``'s database waiting for a row lock right now (the servers).

    InnoDB answers ``information_schema.innodb_trx`` from a cache it refreshes only
    when it has not been read for 0.1 s: poll it more slowly than that.
    """
    if engine.dialect.name == "postgresql":
        query = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                 "AND datname = current_database()")
    else:
        # innodb_trx is server-wide: only this database's sessions, as on PostgreSQL
        # (other suites' waits on the same server must not count).
        query = ("SELECT count(*) FROM information_schema.innodb_trx AS trx "
                 "JOIN information_schema.processlist AS session "
                 "ON session.id = trx.trx_mysql_thread_id "
                 "WHERE trx.trx_state = 'LOCK WAIT' AND session.db = DATABASE()")
    # A connection of its own each time: PostgreSQL keeps one activity snapshot per transaction.
    with engine.connect() as connection:
        return int(connection.exec_driver_sql(query).scalar_one())


def session_id(connection: Any) -> int:
    """The server's id of ``connection``'s session (PostgreSQL's backend pid, MariaDB's thread)."""
    query = ("SELECT pg_backend_pid()" if connection.dialect.name == "postgresql"
             else "SELECT CONNECTION_ID()")
    return int(connection.exec_driver_sql(query).scalar_one())


def blocked_by(engine: Any, holder: int) -> int:
    """Sessions waiting right now for a lock the session ``holder`` holds (the servers).

    Poll it no faster than :data:`LOCK_POLL_SECONDS` on MariaDB (see :func:`lock_waiters`).
    """
    if engine.dialect.name == "postgresql":
        query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                 f"AND {int(holder)} = ANY(pg_blocking_pids(pid))")
    else:
        query = ("SELECT count(*) FROM information_schema.innodb_lock_waits AS waits "
                 "JOIN information_schema.innodb_trx AS blocking "
                 "ON blocking.trx_id = waits.blocking_trx_id "
                 f"WHERE blocking.trx_mysql_thread_id = {int(holder)}")
    with engine.connect() as connection:
        return int(connection.exec_driver_sql(query).scalar_one())
