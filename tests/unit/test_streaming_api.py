"""quotagate.streaming exports what we mean, and needs pyspark only for the Spark sink."""

from __future__ import annotations

import subprocess
import sys

import pytest

import quotagate.streaming
import quotagate.streaming.spark


def test_streaming_api_is_what_we_mean_to_export() -> None:
    assert set(quotagate.streaming.__all__) == {
        "BatchMarker", "BatchResult", "Fencing", "SinkStore", "StaleFencingToken"}
    assert set(quotagate.streaming.spark.__all__) == {
        "IdempotentSink", "fencing_from_environment", "idempotent_sink", "local_session"}


def test_the_sink_store_lab_and_diagnose_import_without_pyspark() -> None:
    code = ("import sys; import quotagate.streaming, quotagate.streaming.spark, quotagate.streaming.diagnose, "
            "quotagate.streaming.lab.runner, quotagate.cli.main; assert 'pyspark' not in sys.modules, 'pyspark'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_fencing_comes_from_what_a_delivery_puts_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUOTAGATE_REQUEST_ID", raising=False)
    assert quotagate.streaming.spark.fencing_from_environment() is None
    monkeypatch.setenv("QUOTAGATE_REQUEST_ID", "job-1")
    monkeypatch.setenv("QUOTAGATE_FENCING_TOKEN", "7")
    assert quotagate.streaming.spark.fencing_from_environment() == quotagate.streaming.Fencing("job-1", 7)
    monkeypatch.setenv("QUOTAGATE_FENCING_TOKEN", "seven")
    with pytest.raises(quotagate.InvalidInput):
        quotagate.streaming.spark.fencing_from_environment()
