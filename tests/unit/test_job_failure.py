"""The exception's line of a failed job's log (quotagate.delivery.targets.job_failure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quotagate.delivery.targets.job_failure import MAX_CAUSE_LENGTH, failure_cause

CHAINED_THEN_JVM = """\
26/12/04 19:00:01 INFO SparkContext: Running Spark version 4.3.0
Traceback (most recent call last):
  File "/srv/jobs/job.py", line 3, in <module>
    connect()
KeyError: 'first'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/jobs/job.py", line 5, in <module>
    raise RuntimeError("sink down")
RuntimeError: sink down
26/12/04 19:00:02 INFO ShutdownHookManager: Shutdown hook called
"""


def test_the_last_traceback_gives_its_exception_line_not_the_jvm_lines_after_it(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text(CHAINED_THEN_JVM)
    assert failure_cause(log, []) == "RuntimeError: sink down"


def test_a_log_without_an_exception_gives_nothing(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("processed 10 rows\nexiting with 3\n")
    assert failure_cause(log, []) is None
    assert failure_cause(tmp_path / "no-such.log", []) is None


def test_values_of_the_given_variables_are_masked_and_the_line_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SINK_URL", "mysql://app:pw-9@db/sales")
    monkeypatch.setenv("SHORT", "ab")  # too short to mask without mangling words
    log = tmp_path / "output.log"
    log.write_text("Traceback (most recent call last):\n  File \"x\", line 1\n"
                   "ValueError: no sink at mysql://app:pw-9@db/sales (ab)\n")
    assert failure_cause(log, ["SINK_URL", "SHORT", "UNSET"]) == "ValueError: no sink at $SINK_URL (ab)"
    log.write_text("Traceback (most recent call last):\nValueError: " + "x" * 5000 + "\n")
    cause = failure_cause(log, [])
    assert cause is not None and len(cause) == MAX_CAUSE_LENGTH and cause.endswith("…")
