"""Child-process writers for the sink tests (importable for spawn)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from quotagate.streaming import SinkStore

EVENT_KEYS = ["event_id"]


def event_columns() -> list[sa.Column[Any]]:
    return [sa.Column("event_id", sa.String(64), nullable=False), sa.Column("amount", sa.Integer)]


def events(first: int, count: int) -> list[dict[str, Any]]:
    return [{"event_id": f"e{index:04d}", "amount": index} for index in range(first, first + count)]


def write_same_batch(url: str, count: int, barrier: Any, results: Any) -> None:
    """Write batch 0 of query "q" once, starting together with the other writers."""
    with SinkStore(url, chunk_size=7) as store:
        table = store.business_table("events", EVENT_KEYS, event_columns)
        store.ensure_tables()
        store.engine.connect().close()  # connect before the race starts
        barrier.wait(timeout=120)  # a writer that died never leaves the other waiting
        result = store.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, count))
    results.put((result.inserted, result.conflicts))
