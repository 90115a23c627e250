"""idempotent_sink under real Spark Structured Streaming, on SQLite, PostgreSQL and MariaDB.

The engine replays at-least-once: a batch whose commit log entry is missing runs
again. The sink makes the business effect happen once all the same, and a stale
executor (an older delivery attempt) writes nothing (docs/streaming.md).
"""

from __future__ import annotations

import datetime
import decimal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate.streaming import SinkStore, StaleFencingToken
from quotagate.streaming.checkpoint import read_checkpoint
from quotagate.streaming.spark import idempotent_sink
from support.databases import fresh_database
from support.spark import EVENT_SCHEMA, run_query, start_session, write_events

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from start_session()


@pytest.fixture
def business_url(backend: str, tmp_path: Path) -> Iterator[str]:
    with fresh_database(backend, tmp_path, create_schema=False) as url:
        yield url


class EngineFailsAfterTheSink:
    """The sink commits, then the driver fails before Spark writes the commit log."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.sink(batch_df, batch_id)
        raise RuntimeError(f"driver lost after the sink committed batch {batch_id}")


def business_write_fails(batch_df: Any, batch_id: int) -> None:
    raise RuntimeError(f"the business write of batch {batch_id} failed")


def test_replays_and_a_deleted_commit_log_converge_to_the_same_rows(
    spark: Any, business_url: str, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    sink = idempotent_sink(business_url, "events", ["event_id"], query_name="q")
    store = SinkStore(business_url)

    def batch1() -> tuple[int, int, int]:
        marker = {marker.batch_id: marker for marker in store.markers("q")}[1]
        return marker.deliveries, marker.inserted, marker.conflicts

    write_events(source, "part-0.json", range(5))
    run_query(spark, source, checkpoint, sink)
    assert store.count_rows("events") == 5

    # Batch 1's business write fails: nothing of it is written, and the engine does not commit it.
    write_events(source, "part-1.json", range(5, 8), tenant="tenant-b")
    with pytest.raises(Exception, match="the business write of batch 1 failed"):
        run_query(spark, source, checkpoint, business_write_fails)
    assert store.count_rows("events") == 5
    assert read_checkpoint(checkpoint).commits == (0,)

    # The restart replays batch 1; it takes effect, but the driver dies before the commit log.
    with pytest.raises(Exception, match="driver lost after the sink committed batch 1"):
        run_query(spark, source, checkpoint, EngineFailsAfterTheSink(sink))
    assert store.count_rows("events") == 8
    assert read_checkpoint(checkpoint).commits == (0,)

    # So the next restart hands the sink batch 1 once more: absorbed as conflicts.
    run_query(spark, source, checkpoint, sink)
    assert store.count_rows("events") == 8
    assert batch1() == (2, 3, 3)
    assert read_checkpoint(checkpoint).commits == (0, 1)

    # Tampering: commits/1 deleted. Spark runs batch 1 a third time, then (Spark 4.3) fails
    # writing the commit entry again, its checksum file .1.crc being still there.
    (checkpoint / "commits" / "1").unlink()
    with pytest.raises(Exception, match="concurrently using"):
        run_query(spark, source, checkpoint, sink)
    assert store.count_rows("events") == 8
    assert batch1() == (3, 3, 6)
    # ... but commits/1 was written again before that failure: the next restart has nothing to do.
    assert read_checkpoint(checkpoint).commits == (0, 1)
    run_query(spark, source, checkpoint, sink)
    assert batch1() == (3, 3, 6)

    # The entry and its checksum deleted: Spark replays batch 1 without any error.
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink()
    run_query(spark, source, checkpoint, sink)
    assert read_checkpoint(checkpoint).commits == (0, 1)
    assert store.count_rows("events") == 8
    assert batch1() == (4, 3, 9)
    store.close()
    sink.close()


def test_two_queries_writing_the_same_batch_at_once_write_its_rows_once(
    spark: Any, business_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    write_events(source, "part-0.json", range(200))
    together = threading.Barrier(2)
    sinks = [idempotent_sink(business_url, "events", ["event_id"], query_name="q", chunk_size=20)
             for _ in range(2)]
    for sink in sinks:
        sink.store.ensure_tables()  # the race is over the rows, not over creating the tables

    def at_once(sink: Any) -> Any:
        def write(batch_df: Any, batch_id: int) -> None:
            together.wait(timeout=120)  # both queries hold batch 0 before either writes it
            sink(batch_df, batch_id)
        return write

    # Two queries over the same source, as two executors replaying one batch from two checkpoints.
    queries = [
        spark.readStream.schema(EVENT_SCHEMA).json(str(source)).writeStream
        .foreachBatch(at_once(sink)).option("checkpointLocation", str(tmp_path / f"checkpoint-{index}"))
        .trigger(availableNow=True).start()
        for index, sink in enumerate(sinks)
    ]
    for query in queries:
        query.awaitTermination()

    [marker] = sinks[0].store.markers("q")
    assert sinks[0].store.count_rows("events") == 200
    assert (marker.batch_id, marker.deliveries, marker.inserted, marker.conflicts) == (0, 2, 200, 200)
    results = [result for sink in sinks for result in sink.results]
    assert [result.rows for result in results] == [200, 200]
    # Each row went in exactly once, through one writer or the other; the other saw it as a conflict.
    assert sum(result.inserted for result in results) == sum(result.conflicts for result in results) == 200
    for sink in sinks:
        sink.close()


def test_a_reprocessed_epoch_from_a_new_checkpoint_inserts_nothing_new(
    spark: Any, business_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    write_events(source, "part-0.json", range(6))
    sink = idempotent_sink(business_url, "events", ["event_id"], query_name="q")
    run_query(spark, source, tmp_path / "first", sink)
    # A lost checkpoint directory: the whole history comes again as batch 0.
    run_query(spark, source, tmp_path / "second", sink)
    [marker] = sink.store.markers("q")
    assert (marker.batch_id, marker.deliveries, marker.inserted, marker.conflicts) == (0, 2, 6, 6)
    assert sink.store.count_rows("events") == 6
    assert [(result.inserted, result.conflicts) for result in sink.results] == [(6, 0), (0, 6)]
    sink.close()


def test_a_stale_executor_is_refused_by_the_business_database(
    spark: Any, business_url: str, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_events(source, "part-0.json", range(4))
    stale = idempotent_sink(business_url, "events", ["event_id"], fencing=("job-1", 1))
    # A takeover delivered the request again with token 2; its job claims the sink at start.
    current = idempotent_sink(business_url, "events", ["event_id"], fencing=("job-1", 2))

    with pytest.raises(Exception, match="fencing token 1 is older than 2"):
        run_query(spark, source, checkpoint, stale)
    assert current.store.count_rows("events") == 0
    assert current.store.markers() == []
    with pytest.raises(StaleFencingToken):
        idempotent_sink(business_url, "events", ["event_id"], fencing=("job-1", 1))

    run_query(spark, source, checkpoint, current)
    assert current.store.count_rows("events") == 4
    assert current.store.fencing_token("job-1") == 2
    stale.close()
    current.close()


def test_a_large_batch_of_typed_columns_is_written_in_chunks_as_one(
    spark: Any, business_url: str, tmp_path: Path
) -> None:
    frame = spark.range(1500).selectExpr(
        "concat('k-', id) AS key", "id AS number", "cast(id AS INT) % 7 AS small", "id / 4.0 AS ratio",
        "id % 2 = 0 AS even", "cast(id AS DECIMAL(12, 2)) AS price",
        "timestamp'2026-01-02 03:04:05' AS at", "date'2026-01-02' AS day",
    )
    sink = idempotent_sink(business_url, "typed", ["key"], chunk_size=100)
    sink(frame, 0)
    sink(frame, 0)
    assert [(result.rows, result.inserted, result.conflicts) for result in sink.results] == [
        (1500, 1500, 0), (1500, 0, 1500)]
    table = sa.Table("typed", sa.MetaData(), autoload_with=sink.store.engine)
    with sink.store.engine.connect() as connection:
        row = connection.execute(sa.select(table).where(table.c.number == 42)).one()
    assert (row.key, row.number, row.small, row.ratio, bool(row.even)) == ("k-42", 42, 0, 10.5, True)
    assert decimal.Decimal(str(row.price)) == decimal.Decimal("42.00")
    assert row.at == datetime.datetime(2026, 1, 2, 3, 4, 5) and row.day == datetime.date(2026, 1, 2)
    assert sink.store.markers()[0].rows_seen == 1500
    sink.close()
