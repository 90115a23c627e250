"""Dialect differences, gathered in one place.

The store asks capability questions (can this engine skip locked rows? what is
the database's clock?) instead of comparing dialect names all over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from quotagate.errors import StoreUnavailable
from quotagate.store.engine import READ_ONLY_OPTION
from quotagate.store.read_deadline import (
    READ_TIMEOUT_OPTION,
    is_statement_timeout,
    read_deadline,
    timed_out,
)

T = TypeVar("T")


class HasDialect(Protocol):
    """An engine, a connection, or a driver-level transaction (quotagate.store.driver)."""

    @property
    def dialect(self) -> Dialect: ...


# Error codes meaning "your transaction lost a race; run it again".
_PG_RETRY_SQLSTATES = {"40001", "40P01", "55P03"}
_MYSQL_RETRY_CODES = {1205, 1213}
# Error codes meaning "the server is not there".
_MYSQL_DOWN_CODES = {2002, 2003, 2006, 2013}


def supports_skip_locked(engine: HasDialect) -> bool:
    return engine.dialect.name in ("postgresql", "mysql")


def reserves_with_lock(engine: HasDialect) -> bool:
    """Can one UPDATE lock (SKIP LOCKED, in a subquery on its own table) and return rows?

    PostgreSQL can; MySQL/MariaDB can neither read the updated table in a
    subquery nor return rows from an UPDATE, so they lock with a SELECT first.
    """
    return engine.dialect.name == "postgresql"


def locks_in_lateral_join(engine: HasDialect) -> bool:
    """Can one SELECT lock rows (SKIP LOCKED) in a LATERAL subquery of another row set?

    PostgreSQL can; MariaDB has no LATERAL, so it asks in separate statements.
    """
    return engine.dialect.name == "postgresql"


def locks_named_tables(engine: HasDialect) -> bool:
    """Can ``FOR UPDATE OF table`` lock one table of a query only? PostgreSQL; not MariaDB."""
    return engine.dialect.name == "postgresql"


def locks_only_rows_returned(engine: HasDialect) -> bool:
    """Does ``SELECT … ORDER BY … LIMIT 1 FOR UPDATE`` lock only the row it returns?

    PostgreSQL locks rows as the LIMIT takes them; InnoDB (MySQL, MariaDB)
    locks every row its sort read, so a claim there locks the one row it wants
    by key (quotagate.store.pool_slices).
    """
    return engine.dialect.name == "postgresql"


def binds_id_arrays(engine: HasDialect) -> bool:
    """Can a statement take a batch's ids as one array parameter (``= ANY(:ids)``)?

    PostgreSQL can, and its generic plans need it: an id list of separate
    parameters is built again for every row a sequential scan reads
    (quotagate.store.outbox_statements, docs/decisions/254). MariaDB and SQLite
    take ``IN`` lists, and found a batch's rows by key in their plans anyway.
    """
    return engine.dialect.name == "postgresql"


def claims_in_one_statement(engine: HasDialect) -> bool:
    """PostgreSQL: a delivery claim's locking reads (CTEs ``FOR UPDATE SKIP LOCKED``), its
    UPDATE and its read of the requests go in one statement (docs/decisions/259). MariaDB
    has no ``UPDATE … RETURNING`` and SQLite no row locks: they keep the statements one
    by one."""
    return engine.dialect.name == "postgresql"


def update_returns_rows(engine: HasDialect) -> bool:
    """Can an UPDATE return the rows it changed (RETURNING)? Not MySQL/MariaDB."""
    return engine.dialect.name in ("postgresql", "sqlite")


def charges_row_by_row(engine: HasDialect) -> bool:
    """Is one conditional UPDATE per charged row cheaper than one for all of them?

    SQLite: a statement costs no round trip, and the one-row form (``WHERE
    tenant = ? AND resource = ?``) runs in about half the time of the CASE over
    all rows (``quotagate.store.statements.charge_row_statement``,
    docs/decisions/051-sqlite-charges-row-by-row.md). A server pays a round trip
    per statement, so there the batch stays one statement.
    """
    return engine.dialect.name == "sqlite"


def batches_writes(engine: HasDialect) -> bool:
    """Can checked writes wait and go to the server together, one round trip for several?

    MariaDB runs a compound statement (``BEGIN NOT ATOMIC … END``) sent as one
    query, and its ``IF ROW_COUNT() <> n THEN SIGNAL …`` checks a write's row
    count on the server (quotagate.store.driver, docs/decisions/036). MySQL has
    compound statements only in stored programs; PostgreSQL and SQLite write at
    once.
    """
    return engine.dialect.name == "mysql" and bool(getattr(engine.dialect, "is_mariadb", False))


def materializes_derived_tables(engine: HasDialect) -> bool:
    """Does the server fill a temporary table for each derived table with a LIMIT?

    MariaDB does: the head read wrapped each tenant's read in one, and spent
    a third of its server time there (docs/decisions/054-flat-head-read-on-mariadb.md),
    so it reads the tenants as the UNION's own parenthesized members
    (``statements.ordered_head_query(flat=True)``). PostgreSQL pulls such
    subqueries into its plan; SQLite parses no parenthesized UNION member.
    """
    return engine.dialect.name == "mysql"


def types_union_columns_from_all_parts(engine: HasDialect) -> bool:
    """Does a UNION's column take its type from every part's, so that a bare NULL in a
    later part needs no CAST? MySQL and MariaDB: the admission snapshot's empty
    columns are then plain NULLs, 1.6 KB of SQL instead of 3 KB parsed at every
    admission (docs/performance.md, "MariaDB `admit(1)`: three statements and a flat
    head read"). Elsewhere the snapshot keeps its typed NULLs."""
    return engine.dialect.name == "mysql"


def code_point_collation(engine: HasDialect) -> str | None:
    """The collation that orders text by code point, as Python compares ``str``, if a
    column's own may not: PostgreSQL's ``C`` (UTF-8 bytes sort in code point order).
    MySQL/MariaDB columns are binary already (docs/decisions/801), SQLite's BINARY
    is its default."""
    return "C" if engine.dialect.name == "postgresql" else None


def reserve_writes_records(engine: HasDialect) -> bool:
    """Can the reserving UPDATE write the outbox rows and audit entries too?

    PostgreSQL: INSERTs in data-modifying WITH clauses read the UPDATE's
    RETURNING rows (docs/decisions/050-reserve-and-record-in-one-statement.md).
    """
    return engine.dialect.name == "postgresql"


def keeps_idle_connections(engine: HasDialect) -> bool:
    """May a connection stay checked out between transactions (quotagate.store.kept_connection)?

    Every backend: SQLite's needs none of the checks a checkout makes; a
    server's is pinged after idle by the keeper itself, as the pool's checkout
    would (docs/decisions/025-ping-after-idle.md, 048-servers-keep-admissions-connection.md).
    """
    return engine.dialect.name in ("sqlite", "postgresql", "mysql", "mariadb")


def raw_cursor(engine: HasDialect) -> type | None:
    """The driver's cursor that takes numbered placeholders (``$1``) and sends the SQL as given.

    psycopg's ``RawCursor``: its default cursor parses every statement for
    ``%(name)s`` placeholders at every execution — in Python, and uncached for
    a statement of more than 50 parameters (admit(16)'s records statement cost
    about 20 µs per admission that way). None where the driver has no such cursor.
    """
    if engine.dialect.driver != "psycopg":
        return None
    raw: type | None = getattr(engine.dialect.loaded_dbapi, "RawCursor", None)
    return raw


def drops_idle_connections(engine: HasDialect) -> bool:
    """Can the database end a connection while it idles (so one must be pinged after idle)?

    A server can (a restart, an idle timeout, an administrator); an SQLite file cannot.
    """
    return engine.dialect.name != "sqlite"


def begin_statement(engine: HasDialect) -> str | None:
    """What a driver-level transaction must send first (quotagate.store.engine's SQLite BEGIN).

    SQLite takes the write lock at BEGIN (docs/decisions/005-sqlite-begin-immediate.md);
    the servers' drivers begin by themselves.
    """
    return "BEGIN IMMEDIATE" if engine.dialect.name == "sqlite" else None


def counts_other_commits(engine: HasDialect) -> bool:
    """Can a connection tell that no other connection committed since it last looked?

    SQLite's ``PRAGMA data_version`` (quotagate.store.admission_reads); a server has no
    such counter.
    """
    return engine.dialect.name == "sqlite"


def database_now(engine: HasDialect) -> sa.ColumnElement[float]:
    """An SQL expression for the database server's clock, in epoch seconds."""
    return dialect_now(engine.dialect.name)


def dialect_now(name: str) -> sa.ColumnElement[float]:
    """:func:`database_now` for a dialect named ``name`` (sqlite, postgresql, mysql)."""
    if name == "postgresql":
        return sa.cast(sa.func.extract("epoch", sa.func.clock_timestamp()), sa.Double)
    if name == "mysql":
        return sa.cast(sa.func.unix_timestamp(sa.func.now(6)), sa.Double)
    return sa.cast(
        (sa.func.julianday(sa.literal_column("'now'")) - 2440587.5) * 86400.0, sa.Double
    )


def is_retryable(error: DBAPIError) -> bool:
    """A deadlock, serialization failure or busy database: the transaction may be rerun."""
    original = error.orig
    sqlstate = getattr(original, "sqlstate", None)
    if sqlstate in _PG_RETRY_SQLSTATES:
        return True
    args = getattr(original, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_RETRY_CODES:
        return True
    message = str(original).lower()
    return "database is locked" in message or "database is busy" in message


def is_unreachable(error: DBAPIError) -> bool:
    if error.connection_invalidated:
        return True
    original = error.orig
    args = getattr(original, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_DOWN_CODES:
        return True
    sqlstate = getattr(original, "sqlstate", None) or ""
    if sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03"):
        return True
    if isinstance(error, OperationalError):
        message = str(original).lower()
        return any(
            phrase in message
            for phrase in ("connection refused", "could not connect", "server closed",
                           "connection is closed", "terminating connection", "unable to open")
        )
    return False


# MySQL's refusals of a connection it took: access denied (to the server, to a
# database), unknown database.
_MYSQL_REFUSED_CODES = {1044, 1045, 1049, 1698}


def refusal_at_connect(error: DBAPIError) -> str | None:
    """The server's sentence when it answered and turned the connection away, else None.

    A wrong user or password, or a database the server does not have, is no server
    that is down, but it is no less a store the command cannot use: it was a
    traceback. The sentence names the user and the database, never the password.
    """
    original = error.orig
    args = getattr(original, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_REFUSED_CODES:
        return str(args[1]) if len(args) > 1 else str(original)
    sqlstate = getattr(original, "sqlstate", None) or ""
    message = str(original)
    # psycopg reports a failed connection attempt as "connection failed: …" with no
    # SQLSTATE; refusals that do come with one are class 28 (authorization) and 3D000.
    if sqlstate.startswith("28") or sqlstate == "3D000" or (
            isinstance(error, OperationalError) and message.startswith("connection failed:")):
        return " ".join(message.rpartition("FATAL:")[2].split())
    return None


def is_schema_missing(error: DBAPIError) -> bool:
    message = str(error.orig).lower()
    return "qg_" in message and any(
        phrase in message for phrase in ("no such table", "doesn't exist", "does not exist")
    )


def translate(error: DBAPIError) -> Exception:
    """The domain error for a driver error, or the error itself when none fits."""
    if is_unreachable(error):
        return StoreUnavailable("the ledger database cannot be reached; nothing was changed")
    refusal = refusal_at_connect(error)
    if refusal is not None:
        # The hint only where it fits: "too many clients" is refused at connect as well.
        hint = "check the user, password and database name of its URL; " if any(
            word in refusal.lower() for word in ("role", "user", "password", "database")) else ""
        return StoreUnavailable(
            f"the database refused the connection ({refusal}); {hint}nothing was changed")
    if is_schema_missing(error):
        return StoreUnavailable(
            "the ledger schema is missing in this database; run 'quotagate init' first",
            code="schema_missing",
        )
    return error


def raise_translated(error: DBAPIError) -> NoReturn:
    """Raise the domain error for ``error`` (from it), or ``error`` itself when none fits."""
    translated = translate(error)
    if translated is error:
        raise error
    raise translated from error


@contextmanager
def reading(engine: Engine, *, single_statement: bool = False) -> Iterator[sa.Connection]:
    """A connection for read-only views, with driver errors translated.

    Every statement runs under the engine's read deadline (quotagate.store.read_deadline):
    past it the view raises StoreUnavailable (503) instead of hanging.

    ``single_statement``: the caller reads rows by primary key with one
    statement (the admission-wait metric's submission times, the overrun
    check), which needs no transaction
    around it and no deadline (a primary-key read waits on no lock). On
    PostgreSQL that saves the BEGIN, SET and ROLLBACK round trips (psycopg sends
    each on its own); switching psycopg to autocommit and back costs nothing.
    MySQL's driver would pay a round trip for each switch, so there (and on
    SQLite) the read keeps its transaction.
    """
    options: dict[str, object] = {READ_ONLY_OPTION: True}
    seconds = float(engine.get_execution_options().get(READ_TIMEOUT_OPTION, 0) or 0)
    if single_statement:
        seconds = 0.0
        if engine.dialect.name == "postgresql":
            options["isolation_level"] = "AUTOCOMMIT"
    try:
        with engine.connect().execution_options(**options) as connection, \
                read_deadline(connection, seconds):
            yield connection
    except DBAPIError as error:
        if is_statement_timeout(error):
            raise timed_out(seconds) from error
        raise_translated(error)


def retry_cause(error: DBAPIError) -> str:
    """Why a retryable error lost its race: ``deadlock`` (or serialization) or ``lock_timeout``."""
    original = error.orig
    sqlstate = getattr(original, "sqlstate", None)
    args = getattr(original, "args", ())
    if sqlstate in ("40001", "40P01") or (args and args[0] == 1213):
        return "deadlock"
    return "lock_timeout"


def run_transaction(
    engine: Engine, work: Callable[[sa.Connection], T], *, attempts: int = 20,
    on_retry: Callable[[DBAPIError], None] | None = None,
) -> T:
    """Run ``work`` in one transaction, again from the start if it lost a race.

    The work must be safe to rerun: everything it did in a failed attempt was
    rolled back with it. ``on_retry`` hears of each rerun (admission counts them).
    """
    def attempt() -> T:
        with engine.begin() as connection:
            return work(connection)

    return rerun_on_conflict(attempt, attempts=attempts, on_retry=on_retry)


def rerun_on_conflict(
    attempt: Callable[[], T], *, attempts: int = 20,
    on_retry: Callable[[DBAPIError], None] | None = None,
) -> T:
    """Call ``attempt`` (one whole transaction) until it does not lose a race.

    Deadlocks, serialization failures and lock timeouts are rerun after a short,
    growing pause; every other database error is translated (the domain's
    errors) or raised as it is.
    """
    delay = 0.002
    for number in range(attempts):
        try:
            return attempt()
        except DBAPIError as error:
            translated = translate(error)
            if translated is not error:
                raise translated from error
            if number + 1 < attempts and is_retryable(error):
                if on_retry is not None:
                    on_retry(error)
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover
