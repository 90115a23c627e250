"""A deadline for read-only views: each engine's own statement timeout.

A view or a scrape that waits on an overloaded database must answer "busy"
(503) instead of hanging its caller. Each engine spells the deadline its own
way, gathered here: PostgreSQL ``SET LOCAL statement_timeout`` (ends with the
read's transaction), MariaDB ``max_statement_time`` and MySQL
``max_execution_time`` (session variables, put back when the read ends),
SQLite a progress handler that interrupts the statement once the deadline
has passed. See docs/dashboard.md.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from quotagate.errors import InvalidInput, StoreUnavailable, quoted

# Execution option on an engine: seconds a read-only view may take (0 = no deadline).
READ_TIMEOUT_OPTION = "quotagate_read_timeout"
ENVIRONMENT_VARIABLE = "QUOTAGATE_READ_TIMEOUT"
DEFAULT_READ_TIMEOUT = 5.0

# Error codes meaning "the statement ran past its deadline".
_PG_TIMEOUT_SQLSTATE = "57014"
_MYSQL_TIMEOUT_CODES = {1969, 3024}
# SQLite calls the handler every this many virtual machine instructions.
_SQLITE_PROGRESS_STEPS = 10_000


def configured_read_timeout() -> float:
    """``$QUOTAGATE_READ_TIMEOUT`` in seconds, else the default; bad values are refused."""
    text = os.environ.get(ENVIRONMENT_VARIABLE)
    if text is None or text == "":
        return DEFAULT_READ_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 3600:
        raise InvalidInput(
            f"{ENVIRONMENT_VARIABLE} must be a number of seconds from 0 (no deadline) to 3600, "
            f"got {quoted(text)}",
            code="invalid_read_timeout",
        )
    return seconds


def is_statement_timeout(error: DBAPIError) -> bool:
    original = error.orig
    if getattr(original, "sqlstate", None) == _PG_TIMEOUT_SQLSTATE:
        return True
    args = getattr(original, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_TIMEOUT_CODES:
        return True
    return _sqlite_interrupted(original)


def _sqlite_interrupted(original: BaseException | None) -> bool:
    # sqlite3 raises OperationalError("interrupted") when the progress handler stops a statement.
    module = type(original).__module__ if original is not None else ""
    return module.startswith("sqlite3") and str(original).lower() == "interrupted"


def timed_out(seconds: float) -> StoreUnavailable:
    return StoreUnavailable(
        f"the ledger database did not answer this read within {seconds:g}s; retry",
        code="store_timeout",
    )


@contextmanager
def read_deadline(connection: sa.Connection, seconds: float) -> Iterator[None]:
    """Bound every statement ``connection`` runs inside the block to ``seconds``."""
    if seconds <= 0:
        yield
        return
    name = connection.dialect.name
    if name == "postgresql":
        # SET takes no bound parameters; the value is a number we formatted.
        connection.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, round(seconds * 1000))}")
        yield
    elif name == "mysql":
        if getattr(connection.dialect, "is_mariadb", False):
            variable, value = "max_statement_time", f"{seconds:.3f}"
        else:
            variable, value = "max_execution_time", str(max(1, round(seconds * 1000)))
        connection.exec_driver_sql(f"SET SESSION {variable} = {value}")
        try:
            yield
        finally:
            with contextlib.suppress(DBAPIError):
                if not connection.closed and not connection.invalidated:
                    connection.exec_driver_sql(f"SET SESSION {variable} = 0")
    elif name == "sqlite":
        raw: Any = connection.connection.dbapi_connection
        deadline = time.monotonic() + seconds
        handler: Callable[[], int] = lambda: int(time.monotonic() > deadline)  # noqa: E731
        raw.set_progress_handler(handler, _SQLITE_PROGRESS_STEPS)
        try:
            yield
        finally:
            raw.set_progress_handler(None, 0)
    else:  # pragma: no cover - the engines quotagate supports are all above
        yield
