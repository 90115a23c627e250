"""A rate store in a SQL database of its own (docs/rate-quotas.md, "Where tokens live").

Such a database needs its table before a bucket can live there. Given an empty one (or, on
SQLite, a path with no file yet), the user was told "the ledger schema is missing in this
database; run 'quotagate init' first (database <the ledger's URL>)": the wrong database, and
a command that does nothing for the one that lacks the table. Now the error names the rate
store and the exact command that sets it up, changes nothing, and leaves no empty SQLite file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quotagate import Quotagate
from support.cli import run
from support.databases import fresh_database


@pytest.fixture
def rate_store_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A second, empty database of the same backend, for the buckets."""
    directory = tmp_path / "rates"
    directory.mkdir()
    with fresh_database(backend, directory, create_schema=False) as url:
        yield url


def test_an_uninitialised_rate_store_is_named_with_the_command_that_sets_it_up(
    db_url: str, rate_store_url: str, tmp_path: Path
) -> None:
    store = ["--rate-store", rate_store_url]
    refused = run("tenant", "set", "team-a", "--quota", "gpu=2", "--rate", "capacity=5,refill=0",
                  *store, db=db_url, cwd=tmp_path, expect=6).stderr
    assert refused.startswith(f"error: rate_store_schema_missing: the rate store {rate_store_url} "
                              "is not set up ("), refused
    command = f"quotagate init --db {rate_store_url}"
    assert refused.rstrip().endswith(f"create it with '{command}'; nothing was changed"), refused
    assert "ledger schema" not in refused and db_url not in refused
    with Quotagate.connect(db_url) as gate:
        assert gate.tenants() == []  # refused whole: not even the tenant was written

    # The command it names is the one that works.
    run(*command.split()[1:], db=db_url, cwd=tmp_path)
    shaped = run("tenant", "set", "team-a", "--quota", "gpu=2", "--rate", "capacity=5,refill=0",
                 *store, db=db_url, cwd=tmp_path).stdout
    assert f"5 of 5 tokens left, no refill: top up with 'quotagate rate add' (store {rate_store_url})" in shaped
    run("pool", "set", "pool-1", "--capacity", "gpu=2", db=db_url, cwd=tmp_path)
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1", *store,
        db=db_url, cwd=tmp_path)
    assert "4 of 5 tokens left" in run("rate", "show", "team-a", *store, db=db_url,
                                      cwd=tmp_path).stdout


@pytest.mark.sqlite
def test_a_sqlite_rate_store_path_with_no_file_is_refused_without_creating_it(
    tmp_path: Path,
) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    missing = tmp_path / "rates.db"
    run("init", db=ledger, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=2", db=ledger, cwd=tmp_path)
    refused = run("rate", "set", "team-a", "capacity=5,refill=0", "--rate-store",
                  f"sqlite:///{missing}", db=ledger, cwd=tmp_path, expect=6).stderr
    assert refused.startswith(f"error: rate_store_schema_missing: the rate store sqlite:///{missing} "
                              f"is not set up (there is no file {missing}); create it with "
                              f"'quotagate init --db sqlite:///{missing}'"), refused
    assert not missing.exists()
    with Quotagate.connect(ledger) as gate:
        assert gate.rate_status("team-a") is None
