"""A Structured Streaming ``foreachBatch`` sink whose business effect happens once.

Spark replays a micro-batch whose sink failed, and re-runs one whose commit log
entry is gone: at-least-once. :func:`idempotent_sink` turns that into
exactly-once *in effect* by writing each batch through
:class:`~quotagate.streaming.sink_store.SinkStore` (rows insert-if-absent on their
business key, the batch marker and the fencing check in one transaction).

pyspark is imported lazily: everything else in quotagate works without the
``spark`` extra.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from quotagate.errors import InvalidInput, quoted
from quotagate.streaming.sink_store import (
    DEFAULT_CHUNK_ROWS,
    BatchResult,
    Fencing,
    SinkStore,
    validate_identifier,
    validate_query_name,
)

__all__ = ["IdempotentSink", "fencing_from_environment", "idempotent_sink", "local_session"]

logger = logging.getLogger(__name__)

# What a quotagate delivery puts in its executor's environment (docs/delivery.md).
REQUEST_ID_VARIABLE = "QUOTAGATE_REQUEST_ID"
FENCING_TOKEN_VARIABLE = "QUOTAGATE_FENCING_TOKEN"
QUERY_NAME_VARIABLE = "QUOTAGATE_QUERY_NAME"
# A string key column needs a length on MySQL to be indexed; 255 keeps three
# utf8mb4 key columns inside InnoDB's 3072-byte index limit.
KEY_STRING_LENGTH = 255


def require_spark() -> Any:
    """The pyspark module, or a clear error naming what to install."""
    try:
        import pyspark
    except ModuleNotFoundError as error:
        raise InvalidInput(
            "pyspark is not installed: pip install 'quotagate[spark]'", code="spark_missing"
        ) from error
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        raise InvalidInput(
            "Spark needs a Java runtime (17 or newer): install one or set JAVA_HOME", code="java_missing"
        )
    return pyspark


def local_session(app_name: str = "quotagate", *, partitions: int = 2) -> Any:
    """A ``local[2]`` SparkSession that listens on 127.0.0.1 only and starts no UI."""
    require_spark()
    # Read by the JVM at start; without it Spark binds to the machine's other interfaces.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.default.parallelism", str(partitions))
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )


def fencing_from_environment() -> Fencing | None:
    """The fencing a quotagate delivery handed this process, if it was started by one."""
    request_id = os.environ.get(REQUEST_ID_VARIABLE)
    token = os.environ.get(FENCING_TOKEN_VARIABLE)
    if not request_id or token is None:
        return None
    try:
        return Fencing(request_id, int(token))
    except ValueError:
        raise InvalidInput(f"${FENCING_TOKEN_VARIABLE} must be a whole number, got {quoted(token)}",
                           code="invalid_fencing") from None


class IdempotentSink:
    """The ``foreachBatch`` function: call it with ``(batch_df, batch_id)``.

    ``results`` keeps what each write in this process did (rows, inserted,
    conflicts, deliveries); the business database keeps the same per batch.
    """

    def __init__(
        self,
        url: str,
        table: str,
        key_columns: Sequence[str],
        *,
        query_name: str | None = None,
        fencing: Fencing | tuple[str, int] | None = None,
        chunk_size: int = DEFAULT_CHUNK_ROWS,
    ) -> None:
        self.table_name = validate_identifier(table, "the business table name")
        if isinstance(key_columns, str) or not key_columns:
            raise InvalidInput("key_columns must be a non-empty list of column names", code="invalid_key_columns")
        self.key_columns = [validate_identifier(key, "a key column") for key in key_columns]
        self.query_name = validate_query_name(query_name or os.environ.get(QUERY_NAME_VARIABLE) or table)
        if isinstance(fencing, tuple):
            fencing = Fencing(*fencing)
        self.fencing = fencing
        self.store = SinkStore(url, chunk_size=chunk_size)
        self.results: list[BatchResult] = []
        self._table: sa.Table | None = None
        if fencing is not None:
            # Claim at once: from now on an older attempt of this request writes nothing,
            # even before this one writes its first batch.
            self.store.claim_fence(fencing)

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        table = self._business_table(batch_df)

        def rows() -> Iterator[dict[str, Any]]:
            # Streams the batch to the driver a partition at a time; the transaction
            # stays open until the last chunk, so no partial batch is ever visible.
            return (row.asDict() for row in batch_df.toLocalIterator())

        result = self.store.write_batch(
            self.query_name, int(batch_id), table, self.key_columns, rows, fencing=self.fencing
        )
        self.results.append(result)
        logger.info("batch %s of %s: %s rows, %s inserted, %s conflicts, delivery %s", result.batch_id,
                    result.query, result.rows, result.inserted, result.conflicts, result.deliveries)

    def close(self) -> None:
        self.store.close()

    def _business_table(self, batch_df: Any) -> sa.Table:
        if self._table is None:
            self._table = self.store.business_table(
                self.table_name, self.key_columns, lambda: columns_for(batch_df.schema, self.key_columns)
            )
        return self._table


def idempotent_sink(
    url: str,
    table: str,
    key_columns: Sequence[str],
    *,
    query_name: str | None = None,
    fencing: Fencing | tuple[str, int] | None = None,
    chunk_size: int = DEFAULT_CHUNK_ROWS,
) -> IdempotentSink:
    """A ``foreachBatch`` function writing into ``table`` at ``url`` exactly once in effect.

    ``query_name`` names the batch markers (default ``$QUOTAGATE_QUERY_NAME``, else
    the table's name); ``fencing=(request_id, token)`` refuses writers older than
    the newest token seen for that request. See docs/streaming.md.
    """
    return IdempotentSink(url, table, key_columns, query_name=query_name, fencing=fencing,
                          chunk_size=chunk_size)


def columns_for(schema: Any, key_columns: Sequence[str]) -> list[sa.Column[Any]]:
    """SQLAlchemy columns for a Spark ``StructType``; key columns are NOT NULL."""
    columns: list[sa.Column[Any]] = []
    for field in schema.fields:
        is_key = field.name in key_columns
        columns.append(sa.Column(field.name, _sql_type(field.dataType, is_key),
                                 nullable=bool(field.nullable) and not is_key))
    return columns


def _sql_type(data_type: Any, is_key: bool) -> sa.types.TypeEngine[Any]:
    name = data_type.typeName()
    simple: dict[str, sa.types.TypeEngine[Any]] = {
        "byte": sa.SmallInteger(), "short": sa.SmallInteger(), "integer": sa.Integer(),
        "long": sa.BigInteger(), "float": sa.Float(), "double": sa.Double(),
        "boolean": sa.Boolean(), "date": sa.Date(), "timestamp": sa.DateTime(),
        "timestamp_ntz": sa.DateTime(), "binary": sa.LargeBinary(),
    }
    if name == "string":
        return sa.String(KEY_STRING_LENGTH) if is_key else sa.Text()
    if name == "decimal":
        return sa.Numeric(data_type.precision, data_type.scale)
    if name in simple:
        return simple[name]
    raise InvalidInput(
        f"a column of Spark type {data_type.simpleString()} cannot be written by the sink; "
        "select or cast it to a plain type first",
        code="sink_unsupported_type",
    )
