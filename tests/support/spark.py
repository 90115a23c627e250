"""Real Spark for the tests: one local[2] session per test module, or a clear skip/failure."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quotagate.errors import InvalidInput
from quotagate.streaming.lab.checkpoint import FAST_START
from support.databases import in_ci

EVENT_SCHEMA = "event_id STRING, tenant STRING, amount INT"


def require_spark() -> None:
    """Skip without pyspark or Java; with CI=true that is a failure, as for a database."""
    from quotagate.streaming.spark import require_spark as check

    try:
        check()
    except InvalidInput as error:
        if in_ci():
            pytest.fail(f"CI=true: {error.message}", pytrace=False)
        pytest.skip(error.message)


def start_session() -> Iterator[Any]:
    require_spark()
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", FAST_START)
    from quotagate.streaming.spark import local_session

    session = local_session("quotagate-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def write_events(directory: Path, name: str, numbers: Iterable[int], tenant: str = "tenant-a") -> None:
    """One JSON-lines file, renamed into place so the file source never reads half of it."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.tmp"
    temporary.write_text("".join(
        json.dumps({"event_id": f"event-{number}", "tenant": tenant, "amount": number}) + "\n"
        for number in numbers
    ))
    temporary.replace(directory / name)


def run_query(spark: Any, source: Path, checkpoint: Path, function: Callable[[Any, int], None],
              schema: str = EVENT_SCHEMA) -> None:
    """Process everything available in ``source`` once; raise if the query fails."""
    query = (
        spark.readStream.schema(schema).json(str(source))
        .writeStream.foreachBatch(function)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
