"""Run a hot transaction straight on the driver, with SQLAlchemy's statements and errors.

Admission is a handful of small statements on a nearby database. Measured on
this project's benchmark (docs/performance.md), SQLAlchemy's ``Connection``
costs about 150 µs to begin and end a transaction and 30 µs to execute a
cached statement: next to SQLite's 20 µs transactions, and to PostgreSQL round
trips of 100 µs, that is most of an admission. So the admission transaction
runs on the DBAPI connection of a pooled connection:

- the statements are still SQLAlchemy Core (``quotagate.store.statements``),
  compiled once per dialect and statement, then executed with their parameters
  on the DBAPI cursor;
- the connection still comes from the engine's pool (same connect settings:
  isolation level, SQLite pragmas, the ping after idle);
- driver errors become SQLAlchemy's (``sqlalchemy.exc.DBAPIError.instance``),
  so retries and translation (:mod:`quotagate.store.dialect`) are the same as
  for every other transaction.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from operator import itemgetter
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import CompileError, DBAPIError
from sqlalchemy.sql.elements import _anonymous_label

from quotagate.store.dialect import (
    batches_writes,
    begin_statement,
    raw_cursor,
    rerun_on_conflict,
)
from quotagate.store.kept_connection import KeptConnection

T = TypeVar("T")


@dataclass(frozen=True)
class _Compiled:
    sql: str
    # Parameter names in placeholder order, for positional paramstyles (SQLite's qmark).
    positions: tuple[str, ...] | None
    # Values of the literals the statement binds itself (``state = 'waiting'``).
    fixed: Mapping[str, Any]
    processors: Mapping[str, Callable[[Any], Any]]
    # Picks the positional tuple out of a dict in one C call (operator.itemgetter):
    # the generator it replaces was a tenth of admit(1)'s Python on SQLite.
    pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
    # The driver's parameters when none are given (a statement of literals only).
    bare: Any = None

    # ``parameters`` as one callable chosen here, once per statement (_binder): the
    # itemgetter itself for a statement with nothing fixed or processed.
    bind: Callable[[Mapping[str, Any]], Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bind", _binder(self))

    def parameters(self, given: Mapping[str, Any]) -> Any:
        """The driver's parameters: a dict (named styles) or a tuple (positional)."""
        return self.bind(given)


def _binder(compiled: _Compiled) -> Callable[[Mapping[str, Any]], Any]:
    """``given -> the driver's parameters`` for ``compiled``: its literals merged under the
    values given, processors (admission's: one float, ``now``) applied to the values given,
    picked into a tuple for positional styles."""
    fixed, pick, bare = compiled.fixed, compiled.pick, compiled.bare
    processors = tuple(compiled.processors.items())
    if pick is not None and not fixed and not processors and bare is None:
        return pick

    def bind(given: Mapping[str, Any]) -> Any:
        if not given and bare is not None:
            return bare
        merged = {**fixed, **given} if fixed else dict(given) if processors else given
        for name, processor in processors:
            if name in given:
                merged[name] = processor(given[name])  # type: ignore[index]
        return merged if pick is None else pick(merged)

    return bind


def _picker(positions: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``mapping -> tuple of its values at positions``; itemgetter returns a bare value for one."""
    if not positions:
        return lambda _mapping: ()
    if len(positions) == 1:
        (only,) = positions
        return lambda mapping: (mapping[only],)
    return itemgetter(*positions)


def _inline_literals(compiled: Any, fixed: dict[str, Any]) -> str:
    """The SQL with the anonymous literals of a named paramstyle written in; removed from ``fixed``.

    ``state = 'waiting'``, ``LIMIT 4``, a snapshot's ``'tenant' AS kind``: a
    dozen per admission statement, which psycopg would adapt and send at every
    execution. Written into the statement they cost nothing per execution (and
    the server plans with the value, as for a literal in raw SQL). Only
    anonymous binds (no caller can pass their value by name), only ``str`` and
    ``int`` values, rendered by SQLAlchemy's own literal rendering (quotes and
    the paramstyle's ``%`` escaped).
    """
    sql: str = compiled.string
    for bind, name in compiled.bind_names.items():
        if name not in fixed or type(bind.value) not in (str, int) \
                or not isinstance(bind.key, _anonymous_label):
            continue
        try:
            literal = compiled.render_literal_value(bind.value, bind.type)
        except (CompileError, NotImplementedError):
            continue
        # A function as the replacement: the literal's backslashes stay as they are.
        sql = re.sub(rf"(?<!%)%\({re.escape(name)}\)s", partial(_same, literal), sql)
        del fixed[name]
    return sql


def _same(text: str, _match: re.Match[str]) -> str:
    return text


@lru_cache(maxsize=1024)
def _compile(dialect: Dialect, statement: sa.Executable) -> _Compiled:
    compiled: Any = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    fixed = {
        name: bind.value
        for bind, name in compiled.bind_names.items()
        if bind.value is not None and not bind.callable
    }
    positions = tuple(compiled.positiontup) if compiled.positional else None
    pick = None if positions is None else _picker(positions)
    sql = compiled.string if positions is not None else _inline_literals(compiled, fixed)
    result = _Compiled(
        sql=sql, positions=positions, fixed=fixed,
        processors=dict(compiled._bind_processors), pick=pick,
    )
    needed = set(positions) if positions is not None else set(compiled.bind_names.values())
    if needed <= set(fixed):
        result = dataclasses.replace(result, bare=result.parameters({}))
    return result


# A placeholder of a named paramstyle, or the escaped percent sign (matched first, left to right).
_NAMED_PLACEHOLDER = re.compile(r"%%|%\(([^)]+)\)s")


@lru_cache(maxsize=1024)
def _numbered(dialect: Dialect, statement: sa.Executable) -> _Compiled:
    """``statement`` for a raw cursor (:func:`quotagate.store.dialect.raw_cursor`).

    The named placeholders become ``$1`` … once, here, with ``%%`` back to
    ``%``; a name used twice keeps its one number. The parameters are then a
    tuple picked in that order, which the driver takes as they are.
    """
    compiled = _compile(dialect, statement)
    numbers: dict[str, str] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return numbers.setdefault(name, f"${len(numbers) + 1}")

    sql = _NAMED_PLACEHOLDER.sub(number, compiled.sql)
    positions = tuple(numbers)
    result = dataclasses.replace(compiled, sql=sql, positions=positions,
                                 pick=_picker(positions), bare=None)
    if set(positions) <= set(compiled.fixed):
        result = dataclasses.replace(result, bare=result.parameters({}))
    return result


def compiled_for_driver(dialect: Dialect, statement: sa.Executable) -> _Compiled:
    """``statement`` compiled for ``dialect``'s driver, once (the rate store's kept connection)."""
    return _compile(dialect, statement)


# The MESSAGE_TEXT of a batched write's failed check: this prefix, then its index.
_SIGNAL_PREFIX = "quotagate batched write "
# MariaDB's error for a SIGNAL of SQLSTATE 45000 (ER_SIGNAL_EXCEPTION).
_SIGNALLED = 1644


class DriverTransaction:
    """Statements of one transaction, executed on the DBAPI cursor.

    ``dialect`` is there for the capability questions of
    :mod:`quotagate.store.dialect`, which ask ``x.dialect.name``. With
    ``numbered`` the cursor is the driver's raw cursor, which takes ``$1``
    placeholders and a tuple (:func:`_numbered`).

    Writes whose only answer is "did they change the rows they should"
    (:meth:`expect`, :meth:`write`, :meth:`write_many`), and locking counts
    that must come out right (:meth:`expect_count`), may wait and go to
    the server together where it can check the row counts itself
    (:func:`quotagate.store.dialect.batches_writes`): MariaDB, whose driver
    costs about 60 µs of Python and a round trip per statement. They are
    sent, in the order they were made, before the next statement that reads
    an answer and before COMMIT (:meth:`flush`), so every lock is taken in
    the same order as before, only later; a failed check raises the failure
    it was given then, and the whole transaction rolls back as before.
    """

    def __init__(self, dialect: Dialect, cursor: Any, *, numbered: bool = False,
                 hide_parameters: bool = False) -> None:
        self.dialect = dialect
        self._cursor = cursor
        self._compile = _numbered if numbered else _compile
        # The engine's hide_parameters: an error's message leaves the values out.
        self._hide_parameters = hide_parameters
        self._statement: str | None = None
        self._parameters: Any = None
        self._batching = batches_writes(self) and hasattr(cursor, "mogrify")
        # The batched writes (and their checks) not sent yet, and each check's failure;
        # the same writes with their placeholders, for an error's message: the values
        # are escaped into the statement sent, and an error must not carry them
        # (the engine's hide_parameters).
        self._pending: list[str] = []
        self._failures: list[Exception] = []
        self._templates: list[str] = []

    def execute(self, statement: sa.Executable, parameters: Mapping[str, Any]) -> Any:
        """Run one statement; the cursor, for ``fetchall``/``rowcount``."""
        if self._pending:
            self.flush()
        compiled = self._compile(self.dialect, statement)
        self._statement, self._parameters = compiled.sql, compiled.bind(parameters)
        self._cursor.execute(self._statement, self._parameters)
        return self._cursor

    def rows(self, statement: sa.Executable, parameters: Mapping[str, Any]) -> list[Any]:
        rows = self.execute(statement, parameters).fetchall()
        # sqlite3 and psycopg hand a list already; PyMySQL a tuple.
        return rows if isinstance(rows, list) else list(rows)

    def rowcount(self, statement: sa.Executable, parameters: Mapping[str, Any]) -> int:
        count: int = self.execute(statement, parameters).rowcount
        return count

    def executemany(self, statement: sa.Executable, rows: Sequence[Mapping[str, Any]]) -> None:
        if len(rows) == 1:  # admit(1)'s case; a driver's executemany costs more than execute
            self.execute(statement, rows[0])
            return
        if self._pending:
            self.flush()
        compiled = self._compile(self.dialect, statement)
        self._statement = compiled.sql
        bind = compiled.bind
        self._parameters = [bind(row) for row in rows]
        self._cursor.executemany(self._statement, self._parameters)

    def expect(self, statement: sa.Executable, parameters: Mapping[str, Any], rows: int,
               failure: Exception) -> None:
        """A write that must change exactly ``rows`` rows; else ``failure`` is raised.

        At once, or, where writes are batched, when they are sent (:meth:`flush`).
        """
        if not self._batching:
            if self.rowcount(statement, parameters) != rows:
                raise failure
            return
        self._pending.append(self._mogrified(statement, parameters))
        self._check("ROW_COUNT()", rows, failure)

    def expect_count(self, statement: sa.Executable, parameters: Mapping[str, Any], count: int,
                     failure: Exception) -> None:
        """A read of one number (a locking ``COUNT``) that must be ``count``; else ``failure``.

        At once, or, where writes are batched, as a check among them: the read
        runs on the server in its place in the batch, and its number never comes
        back to the client (:meth:`flush`).
        """
        if not self._batching:
            (found,) = self.execute(statement, parameters).fetchone()
            if int(found) != count:
                raise failure
            return
        compiled = _compile(self.dialect, statement)
        text = self._cursor.mogrify(compiled.sql, compiled.parameters(parameters) or {})
        self._check(f"({text})", count, failure, template=f"({compiled.sql})")

    def _check(self, number: str, expected: int, failure: Exception, *,
               template: str | None = None) -> None:
        """Batched: SIGNAL unless the server's ``number`` is ``expected``; ``failure`` then.

        ``template``: ``number`` with its placeholders, for an error's message.
        """
        # The failure's index, not its text, goes to the server: it only has to come back.
        then = (f" THEN SIGNAL SQLSTATE '45000'"
                f" SET MESSAGE_TEXT = '{_SIGNAL_PREFIX}{len(self._failures)}'; END IF")
        self._pending.append(f"IF {number} <> {int(expected)}{then}")
        self._templates.append(f"IF {template or number} <> {int(expected)}{then}")
        self._failures.append(failure)

    def expect_rows(self, statement: sa.Executable, rows: Sequence[Mapping[str, Any]],
                    failure: Exception) -> None:
        """:meth:`expect` of a one-row write run once per set of ``rows``: each must
        change its row, else ``failure`` is raised (sqlite3 sums an executemany's
        row counts; batched writes check each)."""
        if self._batching:
            for row in rows:
                self.expect(statement, row, 1, failure)
            return
        self.executemany(statement, rows)
        if self._cursor.rowcount != len(rows):
            raise failure

    def write(self, statement: sa.Executable, parameters: Mapping[str, Any]) -> None:
        """A write nothing is read back from: at once, or batched (:meth:`flush`)."""
        if not self._batching:
            self.execute(statement, parameters)
            return
        self._pending.append(self._mogrified(statement, parameters))

    def write_many(self, statement: sa.Executable, rows: Sequence[Mapping[str, Any]]) -> None:
        """:meth:`write` for several rows of one single-row INSERT: one multi-row INSERT."""
        if not self._batching:
            self.executemany(statement, rows)
            return
        compiled = _compile(self.dialect, statement)
        head, values = compiled.sql.split(" VALUES ")  # a single-row INSERT has one
        self._templates.append(f"{compiled.sql} (rows: {len(rows)})")
        self._pending.append(f"{head} VALUES " + ", ".join(
            self._cursor.mogrify(values, compiled.parameters(row) or {}) for row in rows))

    @property
    def batching(self) -> bool:
        """Do checked writes (and :meth:`expect_count`) wait for :meth:`flush`?"""
        return self._batching

    @property
    def pending(self) -> bool:
        """Are batched writes waiting to be sent?"""
        return bool(self._pending)

    def flush(self) -> None:
        """Send the batched writes as one compound statement; raise the first failed check's failure.

        The statements before a failed check have run: the caller rolls the
        transaction back, as after a failed check made at once.
        """
        if not self._pending:
            return
        block = "BEGIN NOT ATOMIC " + "; ".join(self._pending) + "; END"
        failures = self._failures
        self._statement = "BEGIN NOT ATOMIC " + "; ".join(self._templates) + "; END"
        self._parameters = None
        self._pending, self._failures, self._templates = [], [], []
        try:
            self._cursor.execute(block)
        except self.dialect.loaded_dbapi.Error as exc:
            failure = _signalled(exc, failures)
            if failure is None:
                raise
            raise failure from exc

    def _mogrified(self, statement: sa.Executable, parameters: Mapping[str, Any]) -> str:
        """The statement with its parameters escaped in, as the driver would send it."""
        compiled = _compile(self.dialect, statement)
        self._templates.append(compiled.sql)
        # An empty dict rather than None: the driver then unescapes the SQL's ``%%``.
        text: str = self._cursor.mogrify(compiled.sql, compiled.parameters(parameters) or {})
        return text

    def wrap(self, error: Exception, invalidated: bool) -> DBAPIError:
        """The SQLAlchemy error for a driver error raised by the last statement."""
        wrapped = DBAPIError.instance(
            self._statement, self._parameters, error, self.dialect.loaded_dbapi.Error,
            hide_parameters=self._hide_parameters, connection_invalidated=invalidated,
            dialect=self.dialect,
        )
        assert isinstance(wrapped, DBAPIError)  # error is a driver error, never a plain one
        return wrapped


def _signalled(error: Exception, failures: Sequence[Exception]) -> Exception | None:
    """The failure whose check raised ``error``, or None for any other error."""
    arguments: tuple[Any, ...] = getattr(error, "args", ())
    if len(arguments) < 2 or arguments[0] != _SIGNALLED or not isinstance(arguments[1], str) \
            or not arguments[1].startswith(_SIGNAL_PREFIX):
        return None
    index = arguments[1].removeprefix(_SIGNAL_PREFIX)
    return failures[int(index)] if index.isdigit() and int(index) < len(failures) else None


def run_driver_transaction(
    engine: Engine, work: Callable[[DriverTransaction], T], *, attempts: int = 20,
    on_retry: Callable[[DBAPIError], None] | None = None, autocommit: bool = False,
    kept: KeptConnection | None = None, begin_waited: Callable[[float], None] | None = None,
) -> T:
    """Like :func:`quotagate.store.dialect.run_transaction`, on the driver connection.

    ``on_retry`` hears of each rerun (admission counts them by cause).
    ``begin_waited`` hears how long each attempt's BEGIN took, where BEGIN takes
    a lock (SQLite's write lock: its wait for another writer is there).
    ``kept``: run on that kept connection when it has one, and keep the
    connection that committed (:class:`KeptConnection`).

    ``autocommit``: each statement of ``work`` is its own transaction, with no
    BEGIN and COMMIT round trips, where the driver switches for free (psycopg,
    sqlite3); MySQL's driver would pay a round trip to switch, so there the
    work keeps its transaction. Only for work whose every statement stands
    alone (the rate store's conditional take).

    ``work`` must be safe to rerun; everything a failed attempt did was rolled
    back with it. Non-driver exceptions (``CapacityChanged``) roll back and
    propagate unchanged.
    """
    switch = autocommit and engine.dialect.name == "postgresql"
    begin = None if autocommit and engine.dialect.name == "sqlite" else begin_statement(engine)
    return rerun_on_conflict(
        lambda: _attempt(engine, work, begin, switch, kept, begin_waited), attempts=attempts,
        on_retry=on_retry,
    )


def _attempt(
    engine: Engine, work: Callable[[DriverTransaction], T], begin: str | None,
    autocommit: bool = False, kept: KeptConnection | None = None,
    begin_waited: Callable[[float], None] | None = None,
) -> T:
    """One try of the transaction; driver errors come out as SQLAlchemy's.

    ``autocommit`` (psycopg only): the connection runs in autocommit for this try.
    """
    dialect = engine.dialect
    driver_error = dialect.loaded_dbapi.Error
    pooled = kept.take() if kept is not None else None
    if pooled is None:
        # The pool hands connect errors up unwrapped (Engine.connect wraps them).
        try:
            pooled = engine.raw_connection()
        except driver_error as exc:
            raise DBAPIError.instance(
                None, None, exc, driver_error, dialect=dialect,
                connection_invalidated=dialect.is_disconnect(exc, None, None),
            ) from exc
    committed = False
    try:
        driver_connection: Any = pooled.driver_connection
        # The DBAPI connection itself for cursor and commit: the pooled proxy would
        # find ``commit`` through its ``__getattr__``, after a failed lookup, at every
        # transaction.
        dbapi_connection: Any = pooled.dbapi_connection
        if autocommit:
            driver_connection.autocommit = True
        raw = raw_cursor(engine)
        cursor = dbapi_connection.cursor() if raw is None else raw(driver_connection)
        transaction = DriverTransaction(dialect, cursor, numbered=raw is not None,
                                        hide_parameters=engine.hide_parameters)
        try:
            if begin is not None:
                if begin_waited is None:
                    cursor.execute(begin)
                else:
                    started = time.perf_counter()
                    try:
                        cursor.execute(begin)
                    finally:  # a BEGIN that gave up (busy) waited too
                        begin_waited(time.perf_counter() - started)
            result = work(transaction)
            transaction.flush()
            dbapi_connection.commit()
            committed = True
            return result
        except driver_error as exc:
            invalidated = dialect.is_disconnect(exc, pooled.dbapi_connection, cursor)
            wrapped = transaction.wrap(exc, invalidated)
            if invalidated:
                pooled.invalidate(exc)
            else:
                roll_back(pooled, driver_error)
            raise wrapped from exc
        except BaseException:
            roll_back(pooled, driver_error)
            raise
    finally:
        if autocommit and pooled.dbapi_connection is not None:  # not if invalidated
            try:
                driver_connection.autocommit = False
            except driver_error as exc:  # a broken connection: it leaves the pool
                pooled.invalidate(exc)
                committed = False
        if not (committed and kept is not None and kept.keep(pooled)):
            hand_back(pooled, committed)


def hand_back(pooled: Any, committed: bool) -> None:
    """Return the connection to the pool; after a commit, without the pool's rollback.

    The pool rolls back every connection handed back to it, unless told that the
    transaction already ended — which SQLAlchemy's own Connection tells it
    (``_close_special``). PyMySQL sends that ROLLBACK to the server whatever the
    state: one more round trip per transaction (psycopg and sqlite3 skip it
    themselves). The private method is used when present, else the plain close.
    """
    close_special = getattr(pooled, "_close_special", None) if committed else None
    if close_special is not None:
        close_special(transaction_reset=True)
    else:
        pooled.close()


def roll_back(pooled: Any, driver_error: type[Exception]) -> None:
    """Roll back; a connection that cannot even do that is dropped from the pool."""
    try:
        pooled.rollback()
    except driver_error as exc:
        pooled.invalidate(exc)


def run_on_connection(connection: sa.Connection, work: Callable[[DriverTransaction], T]) -> T:
    """Run ``work``'s statements on the driver cursor of ``connection``'s open transaction.

    For a transaction whose hot statements are precompiled but whose rarer parts
    (a fence, a guard, budgets) stay SQLAlchemy expressions on ``connection``
    (:mod:`quotagate.store.release`, docs/decisions/246): both run on the one
    DBAPI connection, in the one transaction that ``connection`` began and commits.
    Driver errors come out as SQLAlchemy's, as from :func:`run_driver_transaction`,
    so the caller's reruns and translation see the same errors; checked writes
    left batched are sent before ``work``'s result is returned.
    """
    dialect = connection.dialect
    pooled: Any = connection.connection
    raw = raw_cursor(connection)
    cursor = pooled.cursor() if raw is None else raw(pooled.driver_connection)
    transaction = DriverTransaction(dialect, cursor, numbered=raw is not None,
                                    hide_parameters=connection.engine.hide_parameters)
    try:
        result = work(transaction)
        transaction.flush()
        return result
    except dialect.loaded_dbapi.Error as exc:
        invalidated = dialect.is_disconnect(exc, pooled.dbapi_connection, cursor)
        wrapped = transaction.wrap(exc, invalidated)
        if invalidated:
            connection.invalidate(exc)
        raise wrapped from exc
    finally:
        if pooled.dbapi_connection is not None:
            cursor.close()
