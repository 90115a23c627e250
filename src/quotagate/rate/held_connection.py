"""The one driver connection a SQL rate store keeps for its own takes, in autocommit.

A refused take on SQLite is a 4 µs UPDATE; checking a connection out of
SQLAlchemy's pool and back in, and building the driver's parameters from a
compiled statement, cost five times that (docs/performance.md). So the store
holds one connection of its engine's, detached from the pool, and runs its
takes on it with statements compiled once (:class:`Prepared`):

- **one at a time**: a caller that finds it busy (another thread is taking)
  does not wait; it takes through the pool as before
  (``quotagate.store.driver.run_driver_transaction``);
- **autocommit**: each conditional UPDATE is a transaction of its own, on
  every engine — MySQL too, where switching a pooled connection would cost a
  round trip each way: this one is switched once, when it is opened;
- **pinged after idle**, like a pooled connection (``store.engine._ping_after_idle``):
  one idle for a while is pinged before use and replaced if the server is gone;
- **not inherited across fork**: a child process opens its own; the parent's
  is left untouched (closing it in the child would end the parent's session).

Driver errors come out as SQLAlchemy's (``DBAPIError.instance``), so
:func:`quotagate.store.dialect.rerun_on_conflict` retries and translates them
as for every other transaction; a connection that broke is dropped.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from quotagate.store.driver import compiled_for_driver
from quotagate.store.engine import PING_AFTER_IDLE

T = TypeVar("T")

# Connections a forked child found held by its parent: kept referenced, never
# closed here, so that the garbage collector does not end the parent's session.
_INHERITED: list[Any] = []
# Every HeldConnection of this process, told when it forks (a per-call getpid()
# is a system call: a tenth of an SQLite refusal here).
_LIVE: weakref.WeakSet[HeldConnection] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for held in list(_LIVE):
        held._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Prepared:
    """A statement compiled once for one dialect, with its driver parameters built fast."""

    def __init__(self, dialect: sa.Dialect, statement: sa.Executable) -> None:
        compiled = compiled_for_driver(dialect, statement)
        self.sql = compiled.sql
        # The literals the statement binds itself, converted once (SQLite's floats).
        self._fixed = {
            name: compiled.processors[name](value) if name in compiled.processors else value
            for name, value in compiled.fixed.items()
        }
        # The driver's own picker of the positional tuple (None: a named paramstyle).
        self._pick = compiled.pick

    def parameters(self, given: Mapping[str, Any]) -> Any:
        values = {**self._fixed, **given}
        return values if self._pick is None else self._pick(values)


class HeldConnection:
    """One autocommit DBAPI connection, lent to one caller at a time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._lock = threading.Lock()
        self._connection: Any = None  # the DBAPI connection, opened at first use
        self._cursor: Any = None
        self._inherited = False  # forked since: the connection is the parent's
        self._used_at = 0.0
        self._closed = False
        _LIVE.add(self)

    def attempt(self, work: Callable[[Any], T]) -> tuple[bool, T | None]:
        """Run ``work(cursor)`` on the held connection: ``(True, result)``, or
        ``(False, None)`` when it is lent to another caller (or closed) right now."""
        if not self._lock.acquire(blocking=False):
            return False, None
        try:
            if self._closed:
                return False, None
            cursor = self._ready()
            try:
                result = work(cursor)
            except self._driver_error as exc:
                raise self._wrap(exc) from exc
            self._used_at = time.monotonic()
            return True, result
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._leave_inherited()
            self._drop()

    def _forked(self) -> None:
        """In the child, right after fork: only the forking thread runs here now."""
        # Another thread of the parent may have held the lock: it never releases it here.
        self._lock = threading.Lock()
        self._inherited = True

    def _leave_inherited(self) -> None:
        """In a forked child, forget the parent's connection without closing it."""
        if self._inherited:
            if self._connection is not None:
                _INHERITED.append(self._connection)
            self._connection = self._cursor = None
            self._inherited = False
            # The pool's idle connections are the parent's too: the next one opened
            # here must be the child's own (SQLAlchemy's way for a forked child).
            self.engine.dispose(close=False)

    def _ready(self) -> Any:
        """The cursor of a connection fit for use: this process's, alive, in autocommit."""
        self._leave_inherited()
        if self._connection is not None and self.dialect.name != "sqlite" \
                and time.monotonic() - self._used_at >= PING_AFTER_IDLE:
            try:
                self.dialect.do_ping(self._connection)
            except self._driver_error:
                self._drop()  # the server restarted, or dropped us: open a new one
        if self._connection is None:
            self._open()
        return self._cursor

    def _open(self) -> None:
        try:
            pooled = self.engine.raw_connection()
        except self._driver_error as exc:  # the pool hands connect errors up unwrapped
            raise self._wrap(exc) from exc
        # Ours from now on: the pool neither counts it nor hands it to anyone else.
        pooled.detach()
        connection: Any = pooled.dbapi_connection
        try:
            name = self.dialect.name
            if name == "postgresql":
                connection.autocommit = True
            elif name == "mysql":
                connection.autocommit(True)
            # sqlite3: the engine's connect hook already set isolation_level None.
            self._cursor = connection.cursor()
        except self._driver_error as exc:
            connection.close()
            raise self._wrap(exc) from exc
        self._connection = connection

    def _wrap(self, error: Any) -> DBAPIError:  # a driver error (its DBAPI module's Error)
        invalidated = bool(self.dialect.is_disconnect(error, self._connection, self._cursor))
        if invalidated:
            self._drop()
        wrapped = DBAPIError.instance(
            None, None, error, self._driver_error, connection_invalidated=invalidated,
            dialect=self.dialect,
        )
        assert isinstance(wrapped, DBAPIError)  # error is a driver error, never a plain one
        return wrapped

    def _drop(self) -> None:
        connection, self._connection, self._cursor = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(self._driver_error):  # broken already: nothing to close
                connection.close()
