"""The lab's scenarios on SQLite, PostgreSQL and MariaDB: every line agrees with the database.

Each scenario runs here on a test database that outlives it, so what it printed
can be checked against what the database holds afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quotagate import Quotagate, RequestState
from quotagate.store.engine import create_engine
from quotagate.store.lease import LeaseStore
from quotagate.streaming import SinkStore
from quotagate.streaming.lab import checkpoint, gate, lease, quota
from quotagate.streaming.lab.observations import Observation
from support.databases import fresh_database
from support.spark import require_spark


def by_name(observations: list[Observation]) -> dict[str, list[dict[str, object]]]:
    named: dict[str, list[dict[str, object]]] = {}
    for observation in observations:
        named.setdefault(observation.name, []).append(observation.fields)
    return named


def test_quota_lines_are_what_the_ledger_holds(empty_db_url: str, tmp_path: Path) -> None:
    lines = [observation.line() for observation in quota.run(empty_db_url, tmp_path)]
    assert lines == ["quotaRequests tenantA=3 tenantB=3 total=6",
                     "quotaRemaining tenantA=2 tenantB=2 requestedEach=3"]
    with Quotagate.connect(empty_db_url) as ledger:
        for tenant in ("tenant-a", "tenant-b"):
            states = [ledger.show(f"{tenant}-job-{index}").state for index in range(3)]
            assert states == [RequestState.WAITING] * 3
            assert ledger.rate_status(tenant)["tokens"] == 2  # type: ignore[index]


def test_gate_lines_are_what_the_ledger_and_the_business_table_hold(empty_db_url: str, tmp_path: Path) -> None:
    lines = [observation.line() for observation in gate.run(empty_db_url, tmp_path)]
    assert lines == ["quotaGate blockedStatus=REJECTED tokensAtBlock=0 businessRowsBlocked=0",
                     "quotaGate recoveredStatus=ACCEPTED tokensAfter=2 businessRowsAccepted=1"]
    with Quotagate.connect(empty_db_url) as ledger:
        assert ledger.show(gate.REQUEST).state == RequestState.COMPLETED
        assert ledger.rate_status(gate.TENANT)["tokens"] == 2  # type: ignore[index]
    with SinkStore(empty_db_url) as business:
        assert business.count_rows(gate.BUSINESS_TABLE) == 1


def test_lease_lines_are_what_the_lease_row_holds(empty_db_url: str, tmp_path: Path) -> None:
    observed = by_name(lease.run(empty_db_url, tmp_path))
    assert observed["leaseHolderKilled"] == [{"signal": "SIGKILL"}]
    assert observed["leaseAcquire"] == [{"holder": "worker-a", "generation": 1}]
    assert observed["leaseTakeover"] == [{"owner": "worker-a", "affected": 1, "generation": 2}]
    assert observed["leaseOwnerOnlyMatches"] == [{"owner": "worker-a", "count": 1}]
    assert observed["leaseStaleWrite"] == [{"owner": "worker-a", "generation": 1, "affected": 0}]
    engine = create_engine(empty_db_url)
    held = LeaseStore(engine).get(lease.NAME)
    engine.dispose()
    assert observed["leaseFinal"] == [{"owner": held.owner, "generation": held.generation}]
    assert (held.owner, held.generation) == ("worker-a", 2)


@pytest.mark.spark
def test_checkpoint_lines_are_what_the_business_table_and_the_checkpoint_hold(tmp_path: Path) -> None:
    require_spark()
    # Four Spark driver processes: on SQLite only, to keep the suite's Spark time small;
    # the same runs against the servers are in test_spark_sink.py.
    with fresh_database("sqlite", tmp_path, create_schema=False) as url:
        workdir = tmp_path / "work"
        workdir.mkdir()
        observations = checkpoint.run(url, workdir)
        with SinkStore(url) as business:
            rows = business.count_rows(checkpoint.TABLE)
            markers = {marker.batch_id: marker for marker in business.markers(checkpoint.QUERY)}
    lines = [observation.line() for observation in observations]
    assert lines[:4] == [
        "checkpointFirstRun exit=0 businessRows=5",
        "checkpointFailedBusiness exit=1 businessRows=5",
        "checkpointReplay exit=0 businessRows=8",
        "checkpointReplayBatches epoch1Reprocessed=True",
    ]
    # What Spark 4.3 does with a deleted commits/1, as docs/streaming.md records it.
    assert lines[4] == "checkpointReplayAgain exit=1 businessRows=8 epoch1Reprocessed=True tamperGuardFired=True"
    assert lines[5] == "checkpointIdempotency batch=1 deliveries=2 conflicts=3"
    assert rows == 8
    assert (markers[0].deliveries, markers[0].inserted) == (1, 5)
    assert (markers[1].deliveries, markers[1].inserted, markers[1].conflicts) == (2, 3, 3)
    assert (workdir / "checkpoint" / "offsets" / "1").exists()
