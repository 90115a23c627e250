"""A user's streaming job as the spark target runs it (a script: the run directory is its cwd).

Payload: ``{"source": DIR, "mode": "once" | "forever"}``. It records the names of
the environment variables it was given in ``environment.json`` in its run
directory, then streams DIR into table ``events`` through the fenced sink.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from quotagate.streaming.spark import fencing_from_environment, idempotent_sink, local_session

SINK_DB_VARIABLE = "SPARK_JOB_SINK_DB"


def main() -> None:
    payload = json.loads(os.environ["QUOTAGATE_PAYLOAD"])
    (Path(os.environ["QUOTAGATE_RUN_DIR"]) / "environment.json").write_text(json.dumps(sorted(os.environ)))
    sink = idempotent_sink(os.environ[SINK_DB_VARIABLE], "events", ["event_id"], fencing=fencing_from_environment())
    spark = local_session("quotagate-spark-target-job")
    spark.sparkContext.setLogLevel("ERROR")
    writer = (
        spark.readStream.schema("event_id STRING, tenant STRING, amount INT").json(payload["source"])
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", os.environ["QUOTAGATE_CHECKPOINT_LOCATION"])
    )
    writer = writer.trigger(availableNow=True) if payload["mode"] == "once" else writer.trigger(
        processingTime="1 second")
    writer.start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
