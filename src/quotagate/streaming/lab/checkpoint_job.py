"""One run of the lab's streaming query, as its own driver process.

``python -m quotagate.streaming.lab.checkpoint_job --source DIR --checkpoint DIR
--table NAME --query NAME [--fail]``, with the business database's URL in
``$QUOTAGATE_LAB_SINK_DB`` (not on the command line, where ``ps`` shows it), reads the JSON files in DIR with
``trigger(availableNow=True)`` and writes through :func:`idempotent_sink`. With
``--fail`` the sink raises before writing, as a business write that fails.

It reports on stdout, one line each, what only the process can tell: every
batch id the engine handed the sink (``LAB_BATCH {"batch_id": …}``), and at the
end the outcome (``LAB_END {…}``). The exit status is the query's: 0 when it
finished, 1 when it failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

BATCH_PREFIX = "LAB_BATCH "
END_PREFIX = "LAB_END "
SCHEMA = "event_id STRING, tenant STRING, amount INT"
KEY_COLUMNS = ["event_id"]
SINK_DB_VARIABLE = "QUOTAGATE_LAB_SINK_DB"


def _emit(prefix: str, data: dict[str, Any]) -> None:
    sys.stdout.write(prefix + json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()


class InjectedFailure(RuntimeError):
    """The lab's stand-in for a business write that fails."""


def run(arguments: argparse.Namespace) -> int:
    from quotagate.streaming.spark import idempotent_sink, local_session

    sink = idempotent_sink(os.environ[SINK_DB_VARIABLE], arguments.table, KEY_COLUMNS, query_name=arguments.query)

    def write(batch_df: Any, batch_id: int) -> None:
        _emit(BATCH_PREFIX, {"batch_id": int(batch_id), "failing": arguments.fail})
        if arguments.fail:
            raise InjectedFailure(f"business write of batch {batch_id} failed (injected by the lab)")
        sink(batch_df, batch_id)

    spark = local_session("quotagate-lab-checkpoint")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        query = (
            spark.readStream.schema(SCHEMA).json(arguments.source)
            .writeStream.queryName("lab")
            .foreachBatch(write)
            .option("checkpointLocation", arguments.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    except Exception as error:  # the query's failure is this process's result
        _emit(END_PREFIX, {
            "ok": False,
            "error_type": type(error).__name__,
            "error_class": _error_class(error),
            "message": str(error)[:2000],
            "results": [result.__dict__ for result in sink.results],
        })
        traceback.print_exc()
        return 1
    finally:
        sink.close()
        spark.stop()
    _emit(END_PREFIX, {"ok": True, "results": [result.__dict__ for result in sink.results]})
    return 0


def _error_class(error: BaseException) -> str | None:
    getter = getattr(error, "getCondition", None) or getattr(error, "getErrorClass", None)
    try:
        value = getter() if getter is not None else None
    except Exception:  # pyspark raises when the JVM side has no condition
        value = None
    return None if value is None else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--query", required=True)
    parser.add_argument("--fail", action="store_true")
    sys.exit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
