"""``quotagate lab`` as a user runs it: throwaway databases that are gone afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from quotagate.store.engine import create_engine
from support.cli import run
from support.databases import MYSQL_URL, POSTGRES_URL

SEED_LINES = [
    "quotaRequests tenantA=3 tenantB=3 total=6",
    "quotaRemaining tenantA=2 tenantB=2 requestedEach=3",
    "quotaGate blockedStatus=REJECTED tokensAtBlock=0 businessRowsBlocked=0",
    "quotaGate recoveredStatus=ACCEPTED tokensAfter=2 businessRowsAccepted=1",
    "leaseAcquire holder=worker-a generation=1",
    "leaseHolderKilled signal=SIGKILL",
    "leaseTakeover owner=worker-a affected=1 generation=2",
    "leaseOwnerOnlyMatches owner=worker-a count=1",
    "leaseStaleWrite owner=worker-a generation=1 affected=0",
    "leaseFinal owner=worker-a generation=2",
]
SERVER_URLS = {"postgresql": POSTGRES_URL, "mysql": MYSQL_URL}
LIST_DATABASES = {
    "postgresql": "SELECT datname FROM pg_database WHERE datname LIKE :pattern",
    "mysql": "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE :pattern",
}


def lab_databases_left(backend: str, run_id: str) -> list[str]:
    engine = create_engine(SERVER_URLS[backend])
    with engine.connect() as connection:
        names = connection.execute(sa.text(LIST_DATABASES[backend]), {"pattern": f"qglab_{run_id}%"}).scalars()
        left = list(names)
    engine.dispose()
    return left


def test_the_lab_on_a_server_prints_the_measured_lines_and_drops_its_databases(
    backend: str, empty_db_url: str, tmp_path: Path
) -> None:
    # empty_db_url only proves the server is up (or skips/fails as for every test).
    server = SERVER_URLS.get(backend)
    arguments = ["lab", "quota", "gate", "lease", "--json"]
    if server is not None:
        arguments += ["--db", server]
    result = run(*arguments, db=empty_db_url, cwd=tmp_path)
    report = json.loads(result.stdout)
    assert report["lines"] == SEED_LINES
    assert report["ok"] and report["cleanup_complete"] and report["failures"] == {}
    assert len(report["databases"]) == 3 and all(entry["removed"] for entry in report["databases"])
    if server is not None:
        assert lab_databases_left(backend, report["run_id"]) == []
    assert report["scenarios"]["lease"]["leaseStaleWrite"] == {"owner": "worker-a", "generation": 1, "affected": 0}


def test_the_lab_prints_the_lines_one_by_one(tmp_path: Path) -> None:
    result = run("lab", "quota", db="sqlite:///unused.db", cwd=tmp_path)
    assert result.stdout.splitlines() == SEED_LINES[:2]
    assert not (tmp_path / "unused.db").exists()


def test_an_unknown_scenario_is_refused(tmp_path: Path) -> None:
    result = run("lab", "everything", db="sqlite:///unused.db", cwd=tmp_path, expect=2)
    assert "everything" in result.stderr



def test_an_unreachable_server_is_reported_without_its_password_and_runs_nothing(tmp_path: Path) -> None:
    result = run("lab", "quota", "--db", "postgresql://postgres:s3cret@127.0.0.1:1/test",
                 db="sqlite:///unused.db", cwd=tmp_path, expect=6)
    assert "lab_database_unavailable" in result.stderr and "s3cret" not in result.stderr
    assert result.stdout == ""
