"""The sink's write path without Spark, on SQLite, PostgreSQL and MariaDB.

A batch, its marker and the fencing check commit together or not at all; rows
are insert-if-absent on the business key, so any replay converges; a writer
with an older fencing token writes nothing (docs/streaming.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import InvalidInput, StaleGeneration
from quotagate.streaming import Fencing, SinkStore, StaleFencingToken
from support.databases import fresh_database
from support.racing import race
from support.sink_workers import EVENT_KEYS, event_columns, events, write_same_batch


@pytest.fixture
def business_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty business database (no ledger schema: the sink needs none)."""
    with fresh_database(backend, tmp_path, create_schema=False) as url:
        yield url


@pytest.fixture
def store(business_url: str) -> Iterator[SinkStore]:
    with SinkStore(business_url, chunk_size=3) as sink_store:
        yield sink_store


def event_table(store: SinkStore) -> sa.Table:
    return store.business_table("events", EVENT_KEYS, event_columns)


def test_a_replayed_batch_converges_and_counts_its_conflicts(store: SinkStore) -> None:
    table = event_table(store)
    first = store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 5))
    replay = store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 5))

    assert (first.inserted, first.conflicts, first.deliveries) == (5, 0, 1)
    assert (replay.inserted, replay.conflicts, replay.deliveries) == (0, 5, 2)
    assert store.count_rows("events") == 5
    [marker] = store.markers("q")
    assert (marker.batch_id, marker.deliveries, marker.inserted, marker.conflicts, marker.last_conflicts) == (
        0, 2, 5, 5, 5)


def test_a_batch_that_overlaps_an_earlier_one_inserts_only_the_new_rows(store: SinkStore) -> None:
    table = event_table(store)
    store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 5))
    # What a re-run over a deleted commit log can hand the sink: old and new rows in one batch.
    result = store.write_batch("q", 1, table, EVENT_KEYS, lambda: events(3, 5))
    assert (result.rows, result.inserted, result.conflicts) == (5, 3, 2)
    assert store.count_rows("events") == 8
    assert [marker.batch_id for marker in store.markers("q")] == [0, 1]


def test_a_batch_failing_midway_leaves_nothing_visible_even_after_chunks_were_written(
    store: SinkStore, business_url: str
) -> None:
    table = event_table(store)
    seen_by_reader: list[int] = []
    reader = sa.create_engine(store.engine.url)

    def rows() -> Iterator[dict[str, Any]]:
        for index, row in enumerate(events(0, 10)):
            if index == 7:
                # Two chunks of three are inserted by now, in the open transaction.
                with reader.connect() as connection:
                    seen_by_reader.append(connection.execute(
                        sa.select(sa.func.count()).select_from(table)).scalar_one())
                raise RuntimeError("the job died in the middle of the batch")
            yield row

    with pytest.raises(RuntimeError, match="died"):
        store.write_batch("q", 0, table, EVENT_KEYS, rows)
    reader.dispose()
    assert seen_by_reader == [0]
    assert store.count_rows("events") == 0
    assert store.markers("q") == []


def test_a_batch_bigger_than_one_statement_may_carry_is_written_in_chunks_as_one(business_url: str) -> None:
    # 17 MB of rows: more than MariaDB accepts in one statement (max_allowed_packet, 16 MB by default),
    # though fewer rows than one chunk holds by count.
    count, width = 340, 50_000
    with SinkStore(business_url) as store:
        table = store.business_table("notes", ["note_id"], lambda: [
            sa.Column("note_id", sa.String(64), nullable=False), sa.Column("note", sa.Text)])
        def rows() -> Iterator[dict[str, Any]]:
            return ({"note_id": f"n{index:04d}", "note": chr(65 + index % 26) * width} for index in range(count))

        first = store.write_batch("q", 0, table, ["note_id"], rows)
        replay = store.write_batch("q", 0, table, ["note_id"], rows)
        assert (first.rows, first.inserted, first.conflicts) == (count, count, 0)
        assert (replay.inserted, replay.conflicts) == (0, count)
        assert store.count_rows("notes") == count
        with store.engine.connect() as connection:
            lengths = connection.execute(sa.select(sa.func.min(sa.func.length(table.c.note)),
                                                   sa.func.max(sa.func.length(table.c.note)))).one()
        assert tuple(lengths) == (width, width)


def test_two_concurrent_writers_of_the_same_batch_write_its_rows_once(business_url: str) -> None:
    count = 40
    outcomes = race(write_same_batch, business_url, count, processes=2)
    with SinkStore(business_url) as store:
        assert store.count_rows("events") == count
        [marker] = store.markers("q")
    assert sum(inserted for inserted, _ in outcomes) == count
    assert sum(conflicts for _, conflicts in outcomes) == count
    assert (marker.deliveries, marker.inserted, marker.conflicts) == (2, count, count)


def test_a_stale_fencing_token_is_refused_and_writes_nothing(store: SinkStore) -> None:
    table = event_table(store)
    store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 2), fencing=Fencing("job-1", 1))
    # A newer delivery attempt of the same request starts and claims the sink.
    assert store.claim_fence(Fencing("job-1", 2)) == 2

    with pytest.raises(StaleFencingToken) as refused:
        store.write_batch("q", 1, table, EVENT_KEYS, lambda: events(2, 3), fencing=Fencing("job-1", 1))

    assert isinstance(refused.value, StaleGeneration)
    assert refused.value.code == "stale_fencing_token"
    assert refused.value.fields == {"request_id": "job-1", "token": 1, "current": 2}
    assert store.count_rows("events") == 2
    assert [marker.batch_id for marker in store.markers("q")] == [0]
    assert store.fencing_token("job-1") == 2
    # The current attempt writes; another request's token is a fence of its own.
    assert store.write_batch("q", 1, table, EVENT_KEYS, lambda: events(2, 3),
                             fencing=Fencing("job-1", 2)).inserted == 3
    assert store.write_batch("q", 2, table, EVENT_KEYS, lambda: events(5, 1),
                             fencing=Fencing("job-2", 1)).inserted == 1
    with pytest.raises(StaleFencingToken):
        store.claim_fence(Fencing("job-1", 1))


def test_a_marker_records_the_fencing_it_was_written_under(store: SinkStore) -> None:
    table = event_table(store)
    store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 1), fencing=Fencing("job-1", 4))
    [marker] = store.markers("q")
    assert (marker.request_id, marker.fencing_token) == ("job-1", 4)


def test_an_existing_table_without_the_unique_key_is_refused(store: SinkStore) -> None:
    with store.engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE plain (event_id VARCHAR(64), amount INTEGER)")
    with pytest.raises(InvalidInput) as refused:
        store.business_table("plain", EVENT_KEYS, event_columns)
    assert refused.value.code == "sink_table_without_unique_key"


def test_an_existing_table_with_the_unique_key_is_used_as_it_is(store: SinkStore) -> None:
    with store.engine.begin() as connection:
        connection.exec_driver_sql(
            "CREATE TABLE keyed (event_id VARCHAR(64) NOT NULL, amount INTEGER, note VARCHAR(20), "
            "PRIMARY KEY (event_id))")
    table = store.business_table("keyed", EVENT_KEYS, event_columns)
    assert [column.name for column in table.c] == ["event_id", "amount", "note"]
    assert store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 2)).inserted == 2


def test_a_row_the_database_would_alter_fails_the_whole_batch(store: SinkStore) -> None:
    table = event_table(store)
    bad = [*events(0, 2), {"event_id": None, "amount": 1}]
    with pytest.raises((InvalidInput, sa.exc.IntegrityError)):
        store.write_batch("q", 0, table, EVENT_KEYS, lambda: bad)
    assert store.count_rows("events") == 0


@pytest.mark.parametrize(("query", "batch_id", "keys", "code"), [
    ("", 0, EVENT_KEYS, "invalid_query_name"),
    ("q", -1, EVENT_KEYS, "invalid_batch_id"),
    ("q", 0, [], "invalid_key_columns"),
    ("q", 0, ["missing"], "invalid_key_columns"),
    ("q", 0, ["event_id; drop table events"], "invalid_identifier"),
])
def test_bad_arguments_are_refused_before_anything_is_written(
    store: SinkStore, query: str, batch_id: int, keys: list[str], code: str
) -> None:
    table = event_table(store)
    with pytest.raises(InvalidInput) as refused:
        store.write_batch(query, batch_id, table, keys, lambda: events(0, 1))
    assert refused.value.code == code
    assert store.count_rows("events") == 0


def test_rows_with_a_column_the_table_lacks_are_refused(store: SinkStore) -> None:
    table = event_table(store)
    with pytest.raises(InvalidInput) as refused:
        store.write_batch("q", 0, table, EVENT_KEYS, lambda: [{"event_id": "e", "colour": "red"}])
    assert refused.value.code == "sink_unknown_columns"
    assert store.count_rows("events") == 0
