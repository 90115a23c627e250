"""Insert-if-absent on a unique key, the one statement whose form differs per engine.

Every form tells how many rows it actually inserted (RETURNING, or MySQL's row
count of one multi-row statement); the rest of the chunk were already present:
conflicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from quotagate.errors import InvalidInput

# MySQL/MariaDB's code for "Duplicate entry": the only warning INSERT IGNORE may raise here.
_MYSQL_DUPLICATE_ENTRY = 1062
# The most bound parameters one statement carries (PostgreSQL's limit is 65535).
MAX_PARAMETERS = 30000


# The most characters of values one chunk carries. MySQL/MariaDB refuse a statement longer than
# max_allowed_packet (16 MiB by default) and drop the connection; a batch of wide rows would
# then fail on every replay, however few rows a chunk holds.
MAX_CHUNK_CHARACTERS = 4 * 1024 * 1024
# Bytes of statement per character of value at worst: UTF-8 and MySQL's escaping of literals.
_MYSQL_BYTES_PER_CHARACTER = 8
# What a value that is not text or bytes counts for: a number or a date as a literal.
_SCALAR_CHARACTERS = 24


def chunk_rows(column_count: int, wanted: int) -> int:
    """How many rows one INSERT may carry for a table of ``column_count`` columns."""
    return max(1, min(wanted, MAX_PARAMETERS // max(1, column_count)))


def chunk_characters(connection: sa.Connection) -> int | None:
    """How many characters of values one chunk may carry on this connection's server.

    None on PostgreSQL and SQLite: their values travel as bound parameters, apart
    from the statement, so only MySQL's literal statements need counting.
    """
    if connection.dialect.name != "mysql":
        return None
    packet = int(connection.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
    return max(1, min(MAX_CHUNK_CHARACTERS, packet // _MYSQL_BYTES_PER_CHARACTER))


def row_characters(row: Mapping[str, Any]) -> int:
    """A cheap upper estimate of a row's size in a statement: its text and bytes, by length."""
    return sum(len(value) if isinstance(value, (str, bytes, bytearray)) else _SCALAR_CHARACTERS
               for value in row.values())


def insert_if_absent(
    connection: sa.Connection,
    table: sa.Table,
    key_columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
) -> int:
    """Insert the rows whose key is not present yet; return how many were inserted."""
    if not rows:
        return 0
    dialect = connection.dialect.name
    if dialect == "postgresql":
        statement: sa.Executable = (
            postgresql_insert(table).on_conflict_do_nothing(index_elements=list(key_columns))
            .returning(table.c[key_columns[0]])
        )
    elif dialect == "sqlite":
        statement = (
            sqlite_insert(table).on_conflict_do_nothing(index_elements=list(key_columns))
            .returning(table.c[key_columns[0]])
        )
    elif dialect == "mysql":
        # INSERT IGNORE is MySQL's insert-if-absent, but it also turns *other* errors
        # (a NULL key, a value cut to fit) into warnings. Those must not pass
        # silently, so every warning but a duplicate key fails the batch.
        connection.exec_driver_sql("SET SESSION max_error_count = 65535")
        statement = table.insert().values(list(rows)).prefix_with("IGNORE")
    else:  # pragma: no cover - create_engine admits only the three engines
        raise InvalidInput(f"the {dialect} engine is not supported", code="invalid_database_url")
    if dialect != "mysql":
        # One cached statement, executed for many rows: SQLAlchemy batches it into
        # multi-row INSERTs itself ("insertmanyvalues"), and RETURNING names exactly
        # the rows inserted (psycopg's row count for INSERT … ON CONFLICT is not reliable).
        return len(connection.execute(statement, [dict(row) for row in rows]).all())
    # On MySQL one literal multi-row statement, so that SHOW WARNINGS covers all of it.
    result = connection.execute(statement)
    _refuse_other_warnings(connection)
    return int(result.rowcount)


def _refuse_other_warnings(connection: sa.Connection) -> None:
    for level, code, message in connection.exec_driver_sql("SHOW WARNINGS"):
        if int(code) != _MYSQL_DUPLICATE_ENTRY:
            raise InvalidInput(
                f"the database would change or drop a value of this batch ({level} {code}: {message}); "
                "nothing of the batch was written",
                code="sink_value_refused",
            )
