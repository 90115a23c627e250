"""Public CLI behaviours that had no test: `admit --loop`, `tenant set --rate none`."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from quotagate import Quotagate, RequestState
from support.cli import QUOTAGATE, run


def test_admit_loop_admits_work_that_arrives_and_stops_on_sigint(
    db_url: str, tmp_path: Path
) -> None:
    run("tenant", "set", "team-a", "--quota", "gpu=4", db=db_url, cwd=tmp_path)
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db_url, cwd=tmp_path)
    loop = subprocess.Popen([*QUOTAGATE, "admit", "--loop", "--interval", "0.05"], cwd=tmp_path,
                            env={**os.environ, "QUOTAGATE_DB": db_url},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Submitted after the loop started: it keeps polling and admits them.
        for number in range(3):
            run("submit", "--id", f"job-{number}", "--tenant", "team-a", "--cost", "gpu=1",
                db=db_url, cwd=tmp_path)
        deadline = time.monotonic() + 60
        with Quotagate.connect(db_url) as gate:
            while {gate.show(f"job-{n}").state for n in range(3)} != {RequestState.RESERVED}:
                assert loop.poll() is None, loop.communicate()
                assert time.monotonic() < deadline, "admit --loop never admitted the work"
                time.sleep(0.05)
    finally:
        loop.send_signal(signal.SIGINT)
        out, err = loop.communicate(timeout=60)
    assert loop.returncode == 0, err
    assert "stopped after admitting 3" in out
    assert sorted(line.split()[1] for line in out.splitlines() if line.startswith("admitted")) == [
        "job-0", "job-1", "job-2"]


def test_tenant_set_rate_none_removes_the_rate_quota(db_url: str, tmp_path: Path) -> None:
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db_url, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=4", "--rate", "capacity=1,refill=0",
        db=db_url, cwd=tmp_path)
    run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1",
        db=db_url, cwd=tmp_path)
    run("submit", "--id", "job-2", "--tenant", "team-a", "--cost", "gpu=1",
        db=db_url, cwd=tmp_path, expect=5)  # rate limited
    removed = run("tenant", "set", "team-a", "--rate", "none", db=db_url, cwd=tmp_path)
    assert "rate" in removed.stdout
    # No bucket any more: submissions are no longer counted, the refused one goes through.
    for request_id in ("job-2", "job-3", "job-4"):
        run("submit", "--id", request_id, "--tenant", "team-a", "--cost", "gpu=1",
            db=db_url, cwd=tmp_path)
    with Quotagate.connect(db_url) as gate:
        assert gate.rate_status("team-a") is None
        assert gate.show("job-2").state == RequestState.WAITING


def test_a_refusal_quotes_at_most_80_characters_of_a_huge_value(
    db_url: str, tmp_path: Path
) -> None:
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db_url, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=4", db=db_url, cwd=tmp_path)
    huge = "9x" * 50_000
    for args, expect in ((("submit", "--id", "job-1", "--tenant", "team-a", "--cost",
                           f"gpu={huge}"), 2),
                         (("show", huge), 4),
                         (("tenant", "set", "team-a", "--quota", "gpu=4", "--budget",
                           f"gpu={huge}"), 2)):
        # Each used to print the whole 100,000 characters back.
        error = run(*args, db=db_url, cwd=tmp_path, expect=expect).stderr
        assert "… (100000 characters)" in error
        assert len(error) < 400, error[:400]


def test_a_payload_nested_past_the_parser_is_refused_with_a_sentence(
    db_url: str, tmp_path: Path
) -> None:
    run("pool", "set", "pool-1", "--capacity", "gpu=4", db=db_url, cwd=tmp_path)
    run("tenant", "set", "team-a", "--quota", "gpu=4", db=db_url, cwd=tmp_path)
    for depth in (3000, 65):  # past the JSON parser's recursion; past the payload's limit
        error = run("submit", "--id", "job-1", "--tenant", "team-a", "--cost", "gpu=1",
                    "--payload", "[" * depth + "]" * depth, db=db_url, cwd=tmp_path,
                    expect=2).stderr
        assert error.startswith("error: invalid_payload: payload nests arrays and objects "
                                "deeper than 64 levels"), error
    with Quotagate.connect(db_url) as gate:
        assert gate.list_requests("team-a").items == []


# The database is named as the user wrote it, password masked: it was named in the driver's
# form (postgresql+psycopg://…), a URL the user never typed.
@pytest.mark.parametrize(("url", "shown", "says"), [
    # Nothing listens on port 9: the server cannot be reached.
    ("postgresql://team:s3cret@127.0.0.1:9/test", "postgresql://team:***@127.0.0.1:9/test",
     "cannot be reached"),
    ("mysql://root:s3cret@127.0.0.1:9/test", "mysql://root:***@127.0.0.1:9/test",
     "cannot be reached"),
    ("postgres://team:s3cret@127.0.0.1:9/test", "postgres://team:***@127.0.0.1:9/test",
     "cannot be reached"),
    # The server answers and refuses: these used to be a traceback.
    ("postgresql://127.0.0.1:5432/no_such_ledger", "postgresql://127.0.0.1:5432/no_such_ledger",
     'refused the connection (database "no_such_ledger" does not exist)'),
    ("mariadb://root@127.0.0.1:3306/no_such_ledger", "mariadb://root@127.0.0.1:3306/no_such_ledger",
     "refused the connection (Unknown database 'no_such_ledger')"),
])
@pytest.mark.parametrize("command", [("tenant", "show", "team-a"), ("worker",), ("serve", "--port", "0")])
def test_an_unusable_database_is_named_with_its_password_masked(
    tmp_path: Path, url: str, shown: str, says: str, command: tuple[str, ...]
) -> None:
    error = run(*command, db=url, cwd=tmp_path, expect=6).stderr
    assert error.startswith("error: store_unavailable: the "), error
    assert says in error
    assert error.rstrip().endswith(f"(database {shown})"), error
    assert "s3cret" not in error
