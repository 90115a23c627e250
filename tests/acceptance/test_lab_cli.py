"""``quotagate lab`` as a user runs it: throwaway databases that are gone afterwards."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate.store.engine import create_engine
from support.cli import run
from support.databases import MYSQL_URL, POSTGRES_URL, fresh_database

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


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "not a url"])
def test_a_bad_server_url_is_one_error_before_any_scenario_runs(url: str, tmp_path: Path) -> None:
    result = run("lab", "quota", "gate", "--db", url, db="sqlite:///unused.db", cwd=tmp_path, expect=2)
    assert result.stdout == ""
    assert result.stderr.count("error: invalid_database_url:") == 1


@pytest.fixture
def account_without_drop(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A MariaDB account that may create and fill lab databases but not drop them: (user, password)."""
    with fresh_database("mysql", tmp_path, create_schema=False):
        pass  # skips (or fails under CI=true) when the server is down, as for every test
    user, password = f"qglab_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    root = create_engine(MYSQL_URL, isolation_level="AUTOCOMMIT")
    with root.connect() as connection:
        connection.execute(sa.text(f"CREATE USER '{user}'@'%' IDENTIFIED BY :password"), {"password": password})
        connection.execute(sa.text(
            "GRANT CREATE, ALTER, INDEX, REFERENCES, SELECT, INSERT, UPDATE, DELETE, LOCK TABLES "
            f"ON `qglab\\_%`.* TO '{user}'@'%'"))
    try:
        yield user, password
    finally:
        # The lab databases it left are dropped by the test, which knows their run id.
        with root.connect() as connection:
            connection.execute(sa.text(f"DROP USER '{user}'@'%'"))
        root.dispose()


@pytest.mark.mysql
def test_a_database_the_lab_cannot_drop_is_reported_and_the_lab_exits_non_zero(
    account_without_drop: tuple[str, str], tmp_path: Path
) -> None:
    user, password = account_without_drop
    # A server URL naming no database: the lab needs none of its own to connect to.
    result = run("lab", "quota", "--json", "--db", f"mysql://{user}:{password}@127.0.0.1:3306",
                 db="sqlite:///unused.db", cwd=tmp_path, expect=1)
    report = json.loads(result.stdout)
    try:
        assert report["lines"] == SEED_LINES[:2]  # the scenario itself ran
        assert report["failures"] == {}
        assert not report["ok"] and not report["cleanup_complete"]
        [database] = report["databases"]
        assert not database["removed"] and "Access denied" in database["error"]
        assert password not in result.stdout + result.stderr
        assert lab_databases_left("mysql", report["run_id"]) == [f"qglab_{report['run_id']}_quota"]
    finally:
        admin = create_engine(MYSQL_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            for name in lab_databases_left("mysql", report["run_id"]):
                connection.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()



def test_an_unreachable_server_is_reported_without_its_password_and_runs_nothing(tmp_path: Path) -> None:
    result = run("lab", "quota", "--db", "postgresql://postgres:s3cret@127.0.0.1:1/test",
                 db="sqlite:///unused.db", cwd=tmp_path, expect=6)
    assert "lab_database_unavailable" in result.stderr and "s3cret" not in result.stderr
    assert result.stdout == ""
