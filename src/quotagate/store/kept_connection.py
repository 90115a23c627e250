"""One database connection its owner keeps between uses, instead of a pool checkout each time.

A checkout and a checkin through SQLAlchemy's pool cost about 20 µs of Python
together: a tenth of an ``admit(1)`` on SQLite, of the Python of one on
PostgreSQL, and five times a refused rate take on SQLite (docs/performance.md).
So two owners keep a connection of their engine's between calls:

- the ledger's admission (docs/decisions/031, 048): a pooled connection whose
  transaction committed is kept for the next one (:meth:`KeptConnection.take`
  and :meth:`KeptConnection.keep`, used by
  :func:`quotagate.store.driver.run_driver_transaction`);
- the SQL rate store's takes (docs/decisions/114): one connection detached
  from the pool and switched to autocommit once, when it is opened — on MySQL
  too, where switching a pooled connection would cost a round trip each way —
  lent to one caller at a time (:meth:`KeptConnection.attempt`).

Either way, the same rules:

- **one at a time**: a caller that finds the connection in use by another
  thread does not wait; it goes through the pool;
- **pinged after idle**, as the pool's checkout would
  (docs/decisions/025-ping-after-idle.md): one unused for
  :data:`PING_AFTER_IDLE` seconds or more (at every use if the engine pings at
  every checkout) is pinged first, and dropped if the server is gone;
- **dropped after a disconnect**, never kept after a failed transaction;
- **given back** at :meth:`KeptConnection.close` (``Ledger.close``, the rate
  store's ``close``) and when its owner is collected; a pooled one of a pool
  the engine replaced (``Engine.dispose``) is not used;
- **not inherited across fork**: a child process opens its own and leaves the
  parent's untouched (closing it in the child would end the parent's session).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from quotagate.store.dialect import drops_idle_connections, keeps_idle_connections
from quotagate.store.engine import PING_AFTER_IDLE

T = TypeVar("T")

# Connections a forked child found kept by its parent: referenced for ever, never
# closed here, so that the garbage collector does not end the parent's session.
_INHERITED: list[Any] = []
# Every KeptConnection of this process, told when it forks (a per-call getpid()
# is a system call: a tenth of an SQLite rate refusal).
_LIVE: weakref.WeakSet[KeptConnection] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for kept in list(_LIVE):
        kept._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class KeptConnection:
    """One connection of ``engine``'s, kept between uses, lent to one caller at a time.

    Without ``autocommit`` it keeps a pooled connection between transactions
    (:meth:`take`, :meth:`keep`), where the dialect allows it
    (:func:`quotagate.store.dialect.keeps_idle_connections`). With it, it runs
    work on one detached autocommit connection (:meth:`attempt`).
    """

    def __init__(self, engine: Engine, *, autocommit: bool = False) -> None:
        self._engine = engine
        self._dialect = engine.dialect
        self._autocommit = autocommit
        self._enabled = autocommit or keeps_idle_connections(engine)
        self._pings = drops_idle_connections(engine)
        self._driver_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        # (the pool it came from, the pooled connection, its cursor or None, when kept);
        # a list so that the finalizer can hand it back without holding this object.
        # At most one entry: popped by the caller that uses it (an atomic step).
        self._slot: list[tuple[Any, Any, Any, float]] = []
        # attempt()'s: taken without waiting, so a second thread goes to the pool.
        self._lock = threading.Lock()
        self._inherited = False  # forked since: what the slot holds is the parent's
        self._closed = False
        weakref.finalize(self, _give_back, self._slot)
        _LIVE.add(self)

    # -- a pooled connection between transactions (the ledger's admission) ----------

    def take(self) -> Any | None:
        """The kept pooled connection, or None: check one out of the pool."""
        if self._inherited:
            self._leave_inherited()
        try:
            pool, pooled, _cursor, kept_at = self._slot.pop()
        except IndexError:
            return None
        if pool is not self._engine.pool:
            pooled.close()  # the engine was disposed: back to the pool it came from
            return None
        if not self._alive(pooled, kept_at):
            return None
        return pooled

    def keep(self, pooled: Any) -> bool:
        """Keep a connection whose transaction committed; False: hand it back as usual."""
        if not self._enabled or self._closed or self._slot or pooled.dbapi_connection is None:
            return False
        self._slot.append((self._engine.pool, pooled, None, time.monotonic()))
        return True

    # -- one detached autocommit connection (the SQL rate store's takes) -------------

    def attempt(self, work: Callable[[Any], T]) -> tuple[bool, T | None]:
        """Run ``work(cursor)`` on the kept autocommit connection: ``(True, result)``, or
        ``(False, None)`` when it is lent to another caller (or closed) right now.

        Driver errors come out as SQLAlchemy's (``DBAPIError.instance``), so
        :func:`quotagate.store.dialect.rerun_on_conflict` retries and translates
        them as for every other transaction; a connection that broke is dropped.
        """
        assert self._autocommit, "attempt() is the autocommit keeper's"
        if not self._lock.acquire(blocking=False):
            return False, None
        try:
            if self._closed:
                return False, None
            if self._inherited:
                self._leave_inherited()
            pooled, cursor = self._lent()
            try:
                result = work(cursor)
            except self._driver_error as exc:
                raise self._wrap(exc, pooled, cursor) from exc
            self._slot.append((None, pooled, cursor, time.monotonic()))
            return True, result
        finally:
            self._lock.release()

    def _lent(self) -> tuple[Any, Any]:
        """The kept connection and its cursor, alive; a new one if there is none."""
        if self._slot:
            _pool, pooled, cursor, kept_at = self._slot.pop()
            if self._alive(pooled, kept_at):
                return pooled, cursor
        try:
            pooled = self._engine.raw_connection()
        except self._driver_error as exc:  # the pool hands connect errors up unwrapped
            raise self._wrap(exc, None, None) from exc
        # Ours from now on: the pool neither counts it nor hands it to anyone else,
        # nor resets it on return (it is closed instead, at close()).
        pooled.detach()
        try:
            connection: Any = pooled.dbapi_connection
            name = self._dialect.name
            if name == "postgresql":
                connection.autocommit = True
            elif name == "mysql":
                connection.autocommit(True)
            # sqlite3: the engine's connect hook already set isolation_level None.
            cursor = connection.cursor()
        except self._driver_error as exc:
            pooled.close()
            raise self._wrap(exc, None, None) from exc
        return pooled, cursor

    def _wrap(self, error: Any, pooled: Any, cursor: Any) -> DBAPIError:
        """SQLAlchemy's error for a driver error; a connection it says is gone is dropped."""
        connection = None if pooled is None else pooled.dbapi_connection
        invalidated = bool(self._dialect.is_disconnect(error, connection, cursor))
        if pooled is not None:
            if invalidated:
                self._drop(pooled, error)
            else:  # an autocommit statement failed alone: the connection is fine
                self._slot.append((None, pooled, cursor, time.monotonic()))
        wrapped = DBAPIError.instance(
            None, None, error, self._driver_error, connection_invalidated=invalidated,
            dialect=self._dialect,
        )
        assert isinstance(wrapped, DBAPIError)  # error is a driver error, never a plain one
        return wrapped

    # -- both ------------------------------------------------------------------------

    def close(self) -> None:
        """Hand the kept connection back (before ``Engine.dispose`` closes the pool)."""
        with self._lock:
            self._closed = True
            if self._inherited:
                self._leave_inherited()
            _give_back(self._slot)

    def _alive(self, pooled: Any, kept_at: float) -> bool:
        """Ping a server's connection after idle; a failed ping drops it (False)."""
        if self._pings and (getattr(self._engine.pool, "_pre_ping", False)
                            or time.monotonic() - kept_at >= PING_AFTER_IDLE):
            try:
                self._dialect.do_ping(pooled.dbapi_connection)
            except Exception as exc:  # the server restarted or dropped it: a fresh one
                self._drop(pooled, exc)
                return False
        return True

    def _drop(self, pooled: Any, error: BaseException) -> None:
        """Let a broken connection go: a pooled one checked in as dropped, a detached one closed."""
        if self._autocommit:
            with contextlib.suppress(Exception):  # broken already: nothing to close
                pooled.close()
        else:
            pooled.invalidate(error)

    def _forked(self) -> None:
        """In the child, right after fork: only the forking thread runs here now."""
        # Another thread of the parent may have held the lock: it never releases it here.
        self._lock = threading.Lock()
        self._inherited = True
        # The parent's connection: never used, nor closed (nor by the finalizer), here.
        _INHERITED.extend(self._slot)
        self._slot.clear()

    def _leave_inherited(self) -> None:
        """At a forked child's first use: its connections must be its own."""
        self._inherited = False
        # The pool's idle connections are the parent's too: the next one opened
        # here must be the child's own (SQLAlchemy's way for a forked child).
        self._engine.dispose(close=False)


def _give_back(slot: list[tuple[Any, Any, Any, float]]) -> None:
    """Back to the pool (a pooled connection) or closed (a detached one)."""
    while slot:
        _pool, pooled, _cursor, _kept_at = slot.pop()
        with contextlib.suppress(Exception):  # broken already: nothing to give back
            pooled.close()
