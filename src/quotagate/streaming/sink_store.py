"""Writing one micro-batch into the business database, exactly once in effect.

A batch's rows, its marker ``(query, batch_id)`` and — with fencing — the check
of the writer's fencing token commit in **one** transaction, so each of them is
true exactly when the others are. Rows are inserted if absent on their business
key: a replayed batch (the engine only promises at-least-once) finds its rows
there and counts them as conflicts instead of writing them twice.

Nothing here needs Spark; :mod:`quotagate.streaming.spark` feeds it batches.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from quotagate.errors import InvalidInput, StaleGeneration, quoted
from quotagate.store.dialect import reading, run_transaction
from quotagate.store.engine import create_engine
from quotagate.streaming import sink_schema
from quotagate.streaming.sink_sql import chunk_characters, chunk_rows, insert_if_absent, row_characters

__all__ = [
    "BatchMarker",
    "BatchResult",
    "Fencing",
    "SinkStore",
    "StaleFencingToken",
    "validate_identifier",
]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
DEFAULT_CHUNK_ROWS = 500


class StaleFencingToken(StaleGeneration):
    """A newer delivery attempt of the same request has written (or claimed) the sink."""

    default_code = "stale_fencing_token"


@dataclass(frozen=True)
class Fencing:
    """What a quotagate delivery hands its executor: whose claim it is, and how new."""

    request_id: str
    fencing_token: int

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not 0 < len(self.request_id) <= 128:
            raise InvalidInput("fencing needs the request id (1-128 characters)", code="invalid_fencing")
        if isinstance(self.fencing_token, bool) or not isinstance(self.fencing_token, int) or self.fencing_token < 0:
            raise InvalidInput("the fencing token must be a whole number >= 0", code="invalid_fencing")


@dataclass(frozen=True)
class BatchResult:
    """What one write of a batch did: ``conflicts`` rows were already there."""

    query: str
    batch_id: int
    rows: int
    inserted: int
    conflicts: int
    deliveries: int

    @property
    def replayed(self) -> bool:
        return self.deliveries > 1


@dataclass(frozen=True)
class BatchMarker:
    """A batch that took effect, as the business database records it."""

    query: str
    batch_id: int
    business_table: str
    deliveries: int
    rows_seen: int
    inserted: int
    conflicts: int
    last_conflicts: int
    request_id: str | None
    fencing_token: int | None
    first_written: float
    last_written: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def validate_identifier(value: object, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise InvalidInput(
            f"{what} must be 1-63 letters, digits or '_', starting with a letter or '_'; got {quoted(value)}",
            code="invalid_identifier",
        )
    return value


def validate_query_name(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 128 or not value.isprintable():
        raise InvalidInput("the query name must be 1-128 printable characters", code="invalid_query_name")
    return value


class SinkStore:
    """The business database at ``url`` (sqlite:///…, postgresql://…, mysql://…)."""

    def __init__(self, url: str, *, chunk_size: int = DEFAULT_CHUNK_ROWS) -> None:
        if chunk_size < 1:
            raise InvalidInput("chunk_size must be at least 1", code="invalid_chunk_size")
        self.engine: Engine = create_engine(url)
        self.chunk_size = chunk_size
        self._tables_ready = False
        # Read from the server in the first batch; None: chunks are bounded by row count alone.
        self._chunk_characters: int | None = None
        self._chunk_characters_known = False

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SinkStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- set-up ----------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Create the marker and fence tables if absent (another writer may race us)."""
        if self._tables_ready:
            return
        _create_racing(self.engine, lambda: sink_schema.metadata.create_all(self.engine))
        self._tables_ready = True

    def business_table(
        self, name: str, key_columns: Sequence[str], columns: Callable[[], Sequence[sa.Column[Any]]]
    ) -> sa.Table:
        """The table ``name``, created from ``columns()`` with a unique key if it does not exist.

        An existing table is used as it is; it must have a primary key or unique
        constraint on exactly ``key_columns``, or insert-if-absent could not work.
        """
        validate_identifier(name, "the business table name")
        keys = _validate_keys(key_columns)
        if not sa.inspect(self.engine).has_table(name):
            defined = list(columns())
            missing = [key for key in keys if key not in {column.name for column in defined}]
            if missing:
                raise InvalidInput(
                    f"key column(s) {', '.join(missing)} are not in the batch's columns",
                    code="invalid_key_columns",
                )
            for column in defined:
                validate_identifier(column.name, "a column name")
            table = sa.Table(name, sa.MetaData(), *defined, sa.UniqueConstraint(*keys, name=f"uq_{name}_key"))
            _create_racing(self.engine, lambda: table.create(self.engine, checkfirst=True))
        table = sa.Table(name, sa.MetaData(), autoload_with=self.engine)
        if not _has_unique_key(self.engine, name, keys):
            raise InvalidInput(
                f"table {quoted(name)} exists without a primary key or unique constraint on exactly "
                f"({', '.join(keys)}); add one so that replayed rows are recognised",
                code="sink_table_without_unique_key",
            )
        return table

    # -- writing ---------------------------------------------------------------

    def claim_fence(self, fencing: Fencing) -> int:
        """Record ``fencing`` as the request's newest claim, or refuse it if a newer one exists.

        Called when a job starts, before its first batch: from then on an older
        attempt of the same request still running writes nothing.
        """
        self.ensure_tables()
        return run_transaction(self.engine, lambda connection: _check_fence(connection, fencing, time.time()))

    def write_batch(
        self,
        query: str,
        batch_id: int,
        table: sa.Table,
        key_columns: Sequence[str],
        rows: Callable[[], Iterable[Mapping[str, Any]]],
        *,
        fencing: Fencing | None = None,
    ) -> BatchResult:
        """Write one batch and its marker in one transaction; return what it did.

        ``rows`` is called once per attempt: a transaction lost to a deadlock is
        rerun from the start, reading the batch again.
        """
        validate_query_name(query)
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise InvalidInput("batch_id must be a whole number >= 0", code="invalid_batch_id")
        keys = _validate_keys(key_columns)
        unknown = [key for key in keys if key not in table.c]
        if unknown:
            raise InvalidInput(f"key column(s) {', '.join(unknown)} are not in table {quoted(table.name)}",
                               code="invalid_key_columns")
        self.ensure_tables()
        chunk = chunk_rows(len(table.c), self.chunk_size)

        def work(connection: sa.Connection) -> BatchResult:
            now = time.time()
            if fencing is not None:
                # First, so a stale writer is refused before it touches a business row.
                _check_fence(connection, fencing, now)
            if not self._chunk_characters_known:
                self._chunk_characters = chunk_characters(connection)
                self._chunk_characters_known = True
            limit = self._chunk_characters
            seen = inserted = pending_characters = 0
            pending: list[Mapping[str, Any]] = []
            for row in rows():
                pending.append(_known_columns(row, table))
                if limit is not None:
                    pending_characters += row_characters(row)
                # A chunk ends at its row count or (on MySQL) its size, whichever comes first.
                if len(pending) >= chunk or (limit is not None and pending_characters >= limit):
                    inserted += insert_if_absent(connection, table, keys, pending)
                    seen += len(pending)
                    pending, pending_characters = [], 0
            inserted += insert_if_absent(connection, table, keys, pending)
            seen += len(pending)
            conflicts = seen - inserted
            deliveries = _mark(connection, query, batch_id, table.name, seen, inserted, conflicts, fencing, now)
            return BatchResult(query, batch_id, seen, inserted, conflicts, deliveries)

        return run_transaction(self.engine, work)

    # -- reading ---------------------------------------------------------------

    def markers(self, query: str | None = None) -> list[BatchMarker]:
        """The batches that took effect (of one query, or all), by query and batch id."""
        marker = sink_schema.batch_marker
        statement = sa.select(marker).order_by(marker.c.query, marker.c.batch_id)
        if query is not None:
            statement = statement.where(marker.c.query == query)
        with reading(self.engine) as connection:
            if not sa.inspect(connection).has_table(marker.name):
                return []
            return [BatchMarker(**row) for row in connection.execute(statement).mappings()]

    def fencing_token(self, request_id: str) -> int | None:
        fence = sink_schema.fence
        with reading(self.engine) as connection:
            if not sa.inspect(connection).has_table(fence.name):
                return None
            token = connection.execute(
                sa.select(fence.c.token).where(fence.c.request_id == request_id)
            ).scalar_one_or_none()
        return None if token is None else int(token)

    def count_rows(self, table: str) -> int:
        """Rows in a business table; 0 when it does not exist yet."""
        validate_identifier(table, "the business table name")
        with reading(self.engine) as connection:
            if not sa.inspect(connection).has_table(table):
                return 0
            return int(connection.execute(
                sa.select(sa.func.count()).select_from(sa.table(table))
            ).scalar_one())


def _validate_keys(key_columns: Sequence[str]) -> list[str]:
    if isinstance(key_columns, str) or not key_columns:
        raise InvalidInput("key_columns must be a non-empty list of column names", code="invalid_key_columns")
    keys = [validate_identifier(key, "a key column") for key in key_columns]
    if len(set(keys)) != len(keys):
        raise InvalidInput("key_columns name a column twice", code="invalid_key_columns")
    return keys


def _known_columns(row: Mapping[str, Any], table: sa.Table) -> Mapping[str, Any]:
    unknown = [name for name in row if name not in table.c]
    if unknown:
        raise InvalidInput(
            f"the batch has column(s) {', '.join(unknown)} that table {quoted(table.name)} lacks; nothing was written",
            code="sink_unknown_columns",
        )
    return row


def _has_unique_key(engine: Engine, name: str, keys: Sequence[str]) -> bool:
    inspector = sa.inspect(engine)
    wanted = set(keys)
    candidates: list[Sequence[str | None]] = [inspector.get_pk_constraint(name).get("constrained_columns") or []]
    candidates += [constraint["column_names"] for constraint in inspector.get_unique_constraints(name)]
    candidates += [index["column_names"] for index in inspector.get_indexes(name) if index.get("unique")]
    return any(set(columns) == wanted for columns in candidates)


def _create_racing(engine: Engine, create: Callable[[], None]) -> None:
    """Run DDL (``checkfirst``) that another writer may be running at the same moment.

    Engines report the lost race differently (PostgreSQL as a duplicate key in
    its catalogue, MySQL as "already exists"), so any failure is retried: the
    next ``checkfirst`` skips what the other writer created. A real error fails
    every time and is raised.
    """
    for attempt in range(3):
        try:
            create()
            return
        except (IntegrityError, OperationalError, ProgrammingError):
            if attempt == 2:
                raise
            time.sleep(0.05 * (attempt + 1))


def _check_fence(connection: sa.Connection, fencing: Fencing, now: float) -> int:
    fence = sink_schema.fence
    insert_if_absent(connection, fence, ["request_id"],
                     [{"request_id": fencing.request_id, "token": fencing.fencing_token, "updated": now}])
    # The locking read orders concurrent writers of one request: a newer token
    # committed first is seen here; one committed later sees ours.
    stored = int(connection.execute(
        sa.select(fence.c.token).where(fence.c.request_id == fencing.request_id).with_for_update()
    ).scalar_one())
    if stored > fencing.fencing_token:
        raise StaleFencingToken(
            f"request {fencing.request_id!r}: fencing token {fencing.fencing_token} is older than {stored}, "
            "which a newer delivery attempt holds; this writer is stale and wrote nothing",
            request_id=fencing.request_id, token=fencing.fencing_token, current=stored,
        )
    if stored < fencing.fencing_token:
        connection.execute(
            fence.update().where(fence.c.request_id == fencing.request_id)
            .values(token=fencing.fencing_token, updated=now)
        )
    return fencing.fencing_token


def _mark(
    connection: sa.Connection, query: str, batch_id: int, table: str, seen: int, inserted: int,
    conflicts: int, fencing: Fencing | None, now: float,
) -> int:
    marker = sink_schema.batch_marker
    insert_if_absent(connection, marker, ["query", "batch_id"], [{
        "query": query, "batch_id": batch_id, "business_table": table, "deliveries": 0,
        "rows_seen": 0, "inserted": 0, "conflicts": 0, "last_conflicts": 0,
        "first_written": now, "last_written": now,
    }])
    where = (marker.c.query == query, marker.c.batch_id == batch_id)
    connection.execute(marker.update().where(*where).values(
        deliveries=marker.c.deliveries + 1,
        rows_seen=seen,
        inserted=marker.c.inserted + inserted,
        conflicts=marker.c.conflicts + conflicts,
        last_conflicts=conflicts,
        request_id=None if fencing is None else fencing.request_id,
        fencing_token=None if fencing is None else fencing.fencing_token,
        last_written=now,
    ))
    return int(connection.execute(sa.select(marker.c.deliveries).where(*where)).scalar_one())

