"""Streaming: sinks whose business effect happens once, the lab, and diagnose.

The checkpoint decides where an engine resumes; only the sink's idempotent,
fenced write makes the effect happen once (docs/streaming.md). The Spark
``foreachBatch`` function is :func:`quotagate.streaming.spark.idempotent_sink`;
it needs the ``spark`` extra, nothing else in this package does.
"""

from quotagate.streaming.sink_store import (
    BatchMarker,
    BatchResult,
    Fencing,
    SinkStore,
    StaleFencingToken,
)

__all__ = ["BatchMarker", "BatchResult", "Fencing", "SinkStore", "StaleFencingToken"]
