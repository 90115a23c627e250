"""`quotagate top --once` as a script runs it: on every backend, and against a running server."""

from __future__ import annotations

from pathlib import Path

import pytest

from quotagate import Quotagate
from quotagate.errors import RateLimited
from support.cli import run
from support.http_servers import make_token, running_server
from support.streams import shared_redis_url, stream_gate, tenant_with_quota
from support.waiting import wait_for


def _ledger(db_url: str) -> str:
    """Two tenants; one request waits for team-a's quota, one of team-b's was rejected."""
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 8})
        gate.set_tenant("team-a", {"gpu": 1})
        gate.set_tenant("team-b", {"gpu": 2})
        gate.set_rate("team-b", "capacity=1,refill=0")
        gate.submit("a-first", "team-a", {"gpu": 1})
        gate.submit("a-second", "team-a", {"gpu": 1})
        gate.submit("b-first", "team-b", {"gpu": 1})
        with pytest.raises(RateLimited):
            gate.submit("b-refused", "team-b", {"gpu": 1})
        assert len(gate.admit(8)) == 2
        reason: str = gate.explain("a-second")["reason"]
    return reason


def test_top_once_prints_tenants_pools_the_queue_with_reasons_and_decisions(
    db_url: str, tmp_path: Path
) -> None:
    reason = _ledger(db_url)
    frame = run("top", "--once", "--width", "200", db=db_url, cwd=tmp_path).stdout
    assert "all tenants" in frame
    for text in ("team-a", "team-b", "main", "Queue head (1 of 1)", "a-second", reason,
                 "b-refused", "rejected", "rate quota exhausted", "1/1", "2/8"):
        assert text in frame, (text, frame)
    narrowed = run("top", "--once", "--width", "200", "--tenant", "team-b", db=db_url,
                   cwd=tmp_path).stdout
    assert "tenant team-b" in narrowed
    assert "a-second" not in narrowed and "team-a" not in narrowed
    bad = run("top", "--once", "--tenant", "Not A Name", db=db_url, cwd=tmp_path, expect=2)
    assert bad.stderr.startswith("error: invalid_tenant_name: tenant name must be"), bad.stderr
    unknown = run("top", "--once", "--tenant", "team-c", db=db_url, cwd=tmp_path, expect=4)
    assert unknown.stderr.startswith("error: unknown_tenant: tenant 'team-c' does not exist"), (
        unknown.stderr)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_top_reads_a_running_server_with_the_tokens_scope(db_url: str, tmp_path: Path) -> None:
    _ledger(db_url)
    with running_server(db_url, tmp_path, args=["--no-workers"]) as server:
        token = make_token(db_url, tenant="team-b")
        frame = run("top", "--once", "--width", "200", "--url", server.url, "--token", token,
                    db=db_url, cwd=tmp_path).stdout
        assert "tenant team-b" in frame and "b-refused" in frame
        assert "team-a" not in frame and "a-second" not in frame
        refused = run("top", "--once", "--url", server.url, "--token", "qg_wrong_token",
                      db=db_url, cwd=tmp_path, expect=1)
        assert refused.stderr.startswith("error: "), refused.stderr
        assert "qg_wrong_token" not in refused.stderr
    missing = run("top", "--once", "--url", "http://127.0.0.1:9", db=db_url, cwd=tmp_path,
                  expect=2)
    assert "error: missing_token: --url needs --token" in missing.stderr


def test_top_once_shows_stream_topics_with_length_and_lag(db_url: str, tmp_path: Path) -> None:
    with stream_gate(db_url, shared_redis_url()) as gate:
        tenant = tenant_with_quota(gate, prefix="top")
        gate.streams.create_topic(tenant, "orders", partitions=2, parallelism=1)
        gate.streams.producer(tenant, "orders").send_many([(f"m{i}", "k") for i in range(4)])
        with gate.streams.consumer(tenant, "orders", "billing", "c1", batch=1) as consumer:
            assert len(wait_for(consumer.poll, "the consumer's first entry")) == 1
    frame = run("top", "--once", "--width", "200", "--tenant", tenant, "--redis",
                shared_redis_url(), db=db_url, cwd=tmp_path).stdout
    assert "Streams (1 of 1 topics)" in frame, frame
    [line] = [line for line in frame.splitlines() if "billing(lag" in line]
    # tenant, topic, partitions, length, pending, lag, DLQ, groups
    assert line.split("│")[1:-1] and [cell.strip() for cell in line.split("│")[1:-1]] == [
        tenant, "orders", "2", "4", "1", "3", "0", "billing(lag 3)"], line


def test_top_once_shows_what_cohort_members_borrow_and_lend_and_the_shared_room(
    db_url: str, tmp_path: Path
) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 8})
        gate.set_cohort("org")
        gate.set_tenant("lender", {"gpu": 3}, cohort="org")
        gate.set_tenant("borrower", {"gpu": 1}, cohort="org", borrowing_limit={"gpu": 2})
        for index in range(4):
            gate.submit(f"b-{index}", "borrower", {"gpu": 1})
        assert len(gate.admit(8)) == 3
        reason: str = gate.explain("b-3")["reason"]
    frame = run("top", "--once", "--width", "200", db=db_url, cwd=tmp_path).stdout
    rows = {cells[0]: cells for line in frame.splitlines()
            if len(cells := [cell.strip() for cell in line.split("│")[1:-1]]) >= 4}
    # tenant, resource, bar, used/nominal, cohort, borrowed, lent
    assert [rows["borrower"][index] for index in (1, 3, 4, 5, 6)] == ["gpu", "3/1", "org", "2", "0"]
    assert [rows["lender"][index] for index in (3, 4, 5, 6)] == ["0/3", "org", "0", "2"]
    assert "Cohorts (shared room)" in frame and rows["org"][3] == "3/4"
    assert reason.startswith("borrowing_limit") and reason in frame


def test_top_once_shows_a_budgets_hours_left_and_the_request_it_keeps_waiting(
    db_url: str, tmp_path: Path
) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_pool("main", {"gpu": 8})
        gate.set_tenant("budgeted", {"gpu": 8}, budget={"gpu": "10h/1d"})
        gate.set_tenant("plain", {"gpu": 1})
        gate.submit("holds", "budgeted", {"gpu": 2}, max_runtime="3h")  # reserves 6 of 10
        assert len(gate.admit(8)) == 1
        gate.submit("over", "budgeted", {"gpu": 1}, max_runtime="5h")  # 5 of the 4 left
        assert gate.admit(8) == []
        reason: str = gate.explain("over")["reason"]
    frame = run("top", "--once", "--width", "220", db=db_url, cwd=tmp_path).stdout
    rows = {cells[0]: cells for line in frame.splitlines()
            if len(cells := [cell.strip() for cell in line.split("│")[1:-1]]) == 5}
    # tenant, resource, bar, used/cap, budget left
    assert rows["budgeted"][3:] == ["2/8", "4h of 10h/1d"], frame
    assert rows["plain"][3:] == ["0/1", "-"], frame
    assert reason.startswith("budget_exhausted: gpu needs 5h, 4h available") and reason in frame
