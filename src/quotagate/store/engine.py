"""Backends chosen by URL: ``sqlite:///file``, ``postgresql://…``, ``mysql://…``.

Each engine is set up here so that the rest of the store can rely on the same
transaction semantics everywhere: READ COMMITTED with row locks on the servers,
and on SQLite one writer at a time (``BEGIN IMMEDIATE``) with WAL so readers
never wait.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from quotagate.errors import InvalidInput, quoted
from quotagate.store.read_deadline import READ_TIMEOUT_OPTION, configured_read_timeout

DEFAULT_DATABASE_URL = "sqlite:///quotagate.db"
# Execution option marking a connection that only reads (see _configure_sqlite).
READ_ONLY_OPTION = "quotagate_read_only"
# Execution option holding the URL as the user gave it, password masked (see shown_url).
_SHOWN_URL_OPTION = "quotagate_shown_url"
ENVIRONMENT_VARIABLE = "QUOTAGATE_DB"
# A pooled connection back in use within this many seconds is not pinged first
# (see _ping_after_idle).
PING_AFTER_IDLE = 1.0
_CHECKED_IN_AT = "quotagate_checked_in_at"
_WAL_SWITCH_WAIT = 30.0  # seconds, as long as the busy timeout

_DRIVERS = {
    "sqlite": ("sqlite+pysqlite", None),
    "postgresql": ("postgresql+psycopg", "postgresql"),
    "postgres": ("postgresql+psycopg", "postgresql"),
    "mysql": ("mysql+pymysql", "mysql"),
    "mariadb": ("mysql+pymysql", "mysql"),
}


def database_url(explicit: str | None = None) -> str:
    """The URL to use: the explicit one, else ``$QUOTAGATE_DB``, else ``./quotagate.db``."""
    return explicit or os.environ.get(ENVIRONMENT_VARIABLE) or DEFAULT_DATABASE_URL


def normalise_url(text: str) -> URL:
    """Map a user's URL to the driver quotagate uses for it, or explain what is wrong."""
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise InvalidInput(
            f"database URL {quoted(redact(text))} is not a URL; expected sqlite:///FILE, "
            "postgresql://USER@HOST/DB or mysql://USER@HOST/DB",
            code="invalid_database_url",
        ) from exc
    backend, _, driver = url.drivername.partition("+")
    if backend not in _DRIVERS:
        raise InvalidInput(
            f"database URL scheme {quoted(url.drivername)} is not supported; "
            "use sqlite, postgresql or mysql",
            code="invalid_database_url",
        )
    wanted, _extra = _DRIVERS[backend]
    if driver and f"{wanted.split('+')[0]}+{driver}" != wanted:
        raise InvalidInput(
            f"driver {quoted(driver)} is not supported; quotagate uses {wanted}",
            code="invalid_database_url",
        )
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise InvalidInput(
                "an in-memory SQLite database cannot be shared between processes; "
                "give a file: sqlite:///quotagate.db",
                code="invalid_database_url",
            )
    elif not url.database:
        raise InvalidInput(
            f"database URL {quoted(redact(text))} names no database", code="invalid_database_url"
        )
    return url.set(drivername=wanted)


def redact(text: str) -> str:
    """The URL with any password replaced, safe to print and log."""
    try:
        return make_url(text).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


def shown_url(engine: Engine) -> str:
    """The engine's database as the user wrote it (``postgresql://…``, not the driver form
    ``postgresql+psycopg://…`` the engine runs on), password masked: what messages name."""
    given = engine.get_execution_options().get(_SHOWN_URL_OPTION)
    return str(given) if given else engine.url.render_as_string(hide_password=True)


def create_engine(
    text: str, *, read_timeout: float | None = None, connections: int | None = None,
    **options: Any,
) -> Engine:
    """An engine for ``text``; ``read_timeout`` (seconds, default $QUOTAGATE_READ_TIMEOUT or 5)
    bounds every read-only view.

    ``connections``: a pool of exactly that many, kept open once opened and never
    exceeded (``serve --db-connections``, docs/decisions/314). Without it, SQLAlchemy's
    default: 5 kept, 10 more opened under load and closed again when handed back.
    """
    url = normalise_url(text)
    if connections is not None:
        if connections < 1:
            raise InvalidInput("the number of database connections must be at least 1",
                               code="invalid_connections")
        options.setdefault("pool_size", connections)
        options.setdefault("max_overflow", 0)
    if read_timeout is None:
        read_timeout = configured_read_timeout()
    backend = url.get_backend_name()
    # Parameters are payloads, reasons and token hashes: a database error's
    # message (logged, or raised into a traceback) must not carry them.
    options.setdefault("hide_parameters", True)
    try:
        if backend == "sqlite":
            engine = sa.create_engine(
                url, connect_args={"timeout": 30, "check_same_thread": False}, **options
            )
            _configure_sqlite(engine)
        else:
            # Row locks plus conditional updates give the guarantees we need;
            # REPEATABLE READ (MySQL's default) would only add gap-lock deadlocks.
            options.setdefault("isolation_level", "READ COMMITTED")
            engine = sa.create_engine(url, **options)
            if not options.get("pool_pre_ping"):
                _ping_after_idle(engine)
        # Read-only views run under this deadline (quotagate.store.read_deadline).
        engine.update_execution_options(**{READ_TIMEOUT_OPTION: read_timeout,
                                           _SHOWN_URL_OPTION: redact(text)})
    except NoSuchModuleError as exc:  # pragma: no cover - depends on extras installed
        raise InvalidInput(str(exc), code="invalid_database_url") from exc
    except ModuleNotFoundError as exc:
        extra = _DRIVERS[backend][1]
        raise InvalidInput(
            f"the {backend} driver is not installed: pip install 'quotagate[{extra}]'",
            code="driver_missing",
        ) from exc
    return engine


def _ping_after_idle(engine: Engine) -> None:
    """Ping a pooled connection before use only if it sat idle for a while.

    ``pool_pre_ping`` pings at every checkout: one more round trip in every
    transaction, a tenth of an admission (docs/performance.md). A connection
    handed back less than :data:`PING_AFTER_IDLE` seconds ago was just working;
    one that idled longer (the server may have restarted meanwhile) is pinged,
    and replaced by a fresh one if the ping fails, as pre-ping would.
    """

    @sa.event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in = record.info.get(_CHECKED_IN_AT)
        if checked_in is None or time.monotonic() - checked_in < PING_AFTER_IDLE:
            return  # a new connection, or one that was working a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool discards this connection and checks out a fresh one.
            raise sa.exc.DisconnectionError(str(exc)) from exc


def _switch_to_wal(cursor: Any) -> None:
    """Put the database file in WAL mode, waiting out another connection doing the same.

    WAL is a property of the file, so only the first connection to a new file
    changes it; two processes opening a new file at once race for that change,
    and SQLite answers the loser "database is locked" at once, without calling
    the busy handler.
    """
    deadline = time.monotonic() + _WAL_SWITCH_WAIT
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _configure_sqlite(engine: Engine) -> None:
    # pysqlite's own transaction handling starts transactions lazily and as
    # DEFERRED, which lets two writers both read "room left" and then fail on
    # upgrade. We take the write lock at BEGIN instead, and use WAL so that
    # readers (inspect, show) never wait for a writer.
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=30000")
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        # Read-only views (quotagate.store.dialect.reading) need no write lock:
        # in WAL mode they read a consistent snapshot while a writer works.
        read_only = connection.get_execution_options().get(READ_ONLY_OPTION, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
