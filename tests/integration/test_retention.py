"""Retention on every backend: `prune` removes finished history in bounded batches and
never a waiting or charged request; refused submits and 403s keep bounded records."""

from __future__ import annotations

import json
import time
from itertools import pairwise
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate import Conflict, ManualClock, Quotagate, RateLimited, RequestState
from quotagate.auth.refusals import RefusalThrottle, refusal_reason
from quotagate.delivery.cleanup import remove_run_directories
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets import process_runner
from quotagate.domain.model import MAX_REJECTED_PAYLOAD_BYTES
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.retention import PrunedBinding, PruneProgress
from support.cli import run
from support.ledger_state import count

DAY = 86400.0


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 100})
    gate.set_pool("pool-1", {"gpu": 100})
    return gate


def _state(gate: Quotagate, request_id: str) -> str | None:
    with gate.engine.connect() as connection:
        value = connection.execute(sa.select(schema.request.c.state)
                                   .where(schema.request.c.id == request_id)).scalar()
    return None if value is None else str(value)


def _history(gate: Quotagate, clock: ManualClock) -> dict[str, str]:
    """One request in every state, all last changed 40 days before 'now'."""
    gate.submit("done", "team-a", {"gpu": 1})
    gate.submit("failed", "team-a", {"gpu": 1})
    gate.submit("reserved", "team-a", {"gpu": 1})
    gate.submit("delivered", "team-a", {"gpu": 1})
    gate.submit("cancelling", "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == 5
    gate.complete("done")
    gate.fail("failed", "it broke")
    with gate.engine.begin() as connection:
        connection.execute(sa.update(schema.request).where(schema.request.c.id == "delivered")
                           .values(state=RequestState.DELIVERED.value))
        connection.execute(sa.update(schema.outbox).where(schema.outbox.c.request_id == "delivered")
                           .values(delivered=True))
    gate.cancel("cancelling")  # a stop to carry out: still charged
    gate.submit("cancelled-waiting", "team-a", {"gpu": 100})
    gate.cancel("cancelled-waiting")
    gate.submit("waiting", "team-a", {"gpu": 100})  # never fits beside the 3 charged: waiting
    clock.advance(40 * DAY)
    return {request_id: str(_state(gate, request_id)) for request_id in (
        "done", "failed", "cancelled-waiting", "reserved", "delivered",
        "cancelling", "waiting")}


def test_prune_removes_only_finished_requests_past_retention(
    ledger: Quotagate, clock: ManualClock
) -> None:
    states = _history(ledger, clock)
    assert states["cancelling"] == "cancelling"  # it was reserved: a stop, still charged
    ledger.submit("recent", "team-a", {"gpu": 1})
    ledger.admit_until_idle()
    ledger.complete("recent")
    before = ledger.check_invariants()
    totals = ledger.prune(30 * DAY)
    assert totals.done
    gone = {request_id for request_id in states if _state(ledger, request_id) is None}
    assert gone == {"done", "failed", "cancelled-waiting"}
    # Waiting and charged requests stay, whatever their age; so does recent history.
    for request_id in ("reserved", "delivered", "cancelling", "waiting", "recent"):
        assert _state(ledger, request_id) is not None, request_id
    assert totals.requests == 3
    for table in (schema.outbox, schema.binding):
        assert count(ledger, table, table.c.request_id.in_(sorted(gone))) == 0
    assert count(ledger, schema.outbox, schema.outbox.c.request_id == "reserved") == 1
    assert ledger.check_invariants() == before == []


def test_prune_deletes_audit_entries_past_retention_only(ledger: Quotagate, clock: ManualClock) -> None:
    with ledger.engine.begin() as connection:
        record(connection, clock.now(), AuditEntry("old", "probe", "ok"))
    clock.advance(40 * DAY)
    with ledger.engine.begin() as connection:
        record(connection, clock.now(), AuditEntry("new", "probe", "ok"))
    old_entries = count(ledger, schema.audit, schema.audit.c.at < clock.now() - 30 * DAY)
    assert old_entries >= 1
    totals = ledger.prune(30 * DAY)
    assert totals.audit_entries == old_entries
    with ledger.engine.connect() as connection:
        actors = set(connection.execute(sa.select(schema.audit.c.actor)).scalars())
    assert "old" not in actors and "new" in actors


def test_prune_works_in_bounded_batches_and_reports_progress(
    ledger: Quotagate, clock: ManualClock
) -> None:
    for number in range(7):
        ledger.submit(f"job-{number}", "team-a", {"gpu": 1})
    ledger.admit_until_idle()
    for number in range(7):
        ledger.complete(f"job-{number}")
    clock.advance(40 * DAY)
    first_seen: list[PruneProgress] = []
    first = ledger.prune(30 * DAY, batch=2, max_batches=2, progress=first_seen.append)
    assert first.requests == 4 and not first.done
    assert [entry.requests for entry in first_seen] == [2, 4, 4]
    assert count(ledger, schema.request) == 3
    rest_seen: list[PruneProgress] = []
    rest = ledger.prune(30 * DAY, batch=2, progress=rest_seen.append)
    assert count(ledger, schema.request) == 0
    assert rest.requests == 3 and rest.done
    assert [entry.requests for entry in rest_seen][:2] == [2, 3]
    audit = [entry.audit_entries for entry in rest_seen]
    assert all(later - earlier <= 2 for earlier, later in pairwise(audit))
    assert rest.audit_entries > 2  # the audit rows went in several batches too


def test_prune_removes_the_run_directories_of_pruned_requests(
    ledger: Quotagate, clock: ManualClock, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs"
    targets = TargetStore(ledger.engine, clock=clock)
    targets.set("local", "process", {"command": ["true"], "run_dir": str(run_dir)})
    for request_id in ("old-run", "live-run"):
        ledger.submit(request_id, "team-a", {"gpu": 1}, target="local")
    ledger.admit_until_idle()
    for request_id in ("old-run", "live-run"):
        (run_dir / f"qg-{request_id}").mkdir(parents=True)
        (run_dir / f"qg-{request_id}" / process_runner.REQUEST).write_text("{}")
        (run_dir / process_runner.EXITED_INDEX).mkdir(exist_ok=True)
        (run_dir / process_runner.EXITED_INDEX / f"qg-{request_id}").touch()
        with ledger.engine.begin() as connection:
            connection.execute(schema.binding.insert().values(
                request_id=request_id, target="local", external_name=f"qg-{request_id}",
                uid="u", fencing_token=1, created=clock.now()))
    ledger.complete("old-run")
    clock.advance(40 * DAY)

    totals = ledger.prune(30 * DAY, forget=lambda found: remove_run_directories(targets, found))
    assert totals.requests == 1 and totals.external_objects == 1
    assert not (run_dir / "qg-old-run").exists()
    assert not (run_dir / process_runner.EXITED_INDEX / "qg-old-run").exists()
    assert (run_dir / "qg-live-run" / process_runner.REQUEST).exists()


def test_a_run_directory_name_never_reaches_outside_the_run_directory(
    ledger: Quotagate, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs"
    outside = tmp_path / "precious"
    outside.mkdir()
    targets = TargetStore(ledger.engine)
    targets.set("local", "process", {"command": ["true"], "run_dir": str(run_dir)})
    run_dir.mkdir()
    removed = remove_run_directories(targets, [
        PrunedBinding("x", "local", "../precious"), PrunedBinding("y", "local", ".."),
        PrunedBinding("z", "local", str(outside)),
    ])
    assert removed == 0
    assert outside.is_dir()


def test_a_refused_submit_keeps_a_bounded_payload_and_still_replays(ledger: Quotagate) -> None:
    ledger.set_rate("team-a", {"capacity": 1, "refill_per_second": 0})
    ledger.submit("first", "team-a", {"gpu": 1})
    big = {"blob": "x" * 20_000}
    small = {"note": "short"}
    with pytest.raises(RateLimited):
        ledger.submit("big", "team-a", {"gpu": 1}, payload=big)
    with pytest.raises(RateLimited):
        ledger.submit("small", "team-a", {"gpu": 1}, payload=small)
    with ledger.engine.connect() as connection:
        stored = dict(connection.execute(
            sa.select(schema.request.c.id, schema.request.c.payload)
            .where(schema.request.c.id.in_(["big", "small"]))).all())
    assert len(stored["big"]) <= MAX_REJECTED_PAYLOAD_BYTES
    assert json.loads(stored["big"])["omitted_payload"]["bytes"] > 20_000
    assert json.loads(stored["small"]) == small
    assert ledger.show("big").state == RequestState.REJECTED
    # The same submission again is the same request (still refused), a changed one a conflict.
    with pytest.raises(RateLimited):
        ledger.submit("big", "team-a", {"gpu": 1}, payload=big)
    with pytest.raises(Conflict):
        ledger.submit("big", "team-a", {"gpu": 1}, payload={"blob": "y" * 20_000})
    # Once a token is there, the resubmit is accepted with its whole payload.
    ledger.add_tokens("team-a", 1)
    accepted = ledger.submit("big", "team-a", {"gpu": 1}, payload=big)
    assert accepted.created and accepted.request.state == RequestState.WAITING
    assert ledger.show("big").payload == big


def test_refusals_write_one_audit_row_per_actor_and_operation_per_window() -> None:
    throttle = RefusalThrottle(window=60)
    now = time.time()
    written = [throttle.admit("tok-a", "request.submit", now + second) for second in range(30)]
    assert written[0] == 1 and written[1:] == [None] * 29
    # Another operation or another actor has its own window.
    assert throttle.admit("tok-a", "tenant.read", now) == 1
    assert throttle.admit("tok-b", "request.submit", now) == 1
    # After the window the next row stands for itself and the 29 not written.
    assert throttle.admit("tok-a", "request.submit", now + 61) == 30
    assert throttle.admit("tok-a", "request.submit", now + 62) is None
    assert "30 refusals" in refusal_reason(30, 60)
    assert refusal_reason(1, 60) == "not authorized"


def test_the_throttle_forgets_the_oldest_actor_beyond_its_bound() -> None:
    throttle = RefusalThrottle(window=60, max_keys=3)
    for actor in ("a", "b", "c", "d"):
        assert throttle.admit(actor, "op", 0.0) == 1
    assert throttle.admit("a", "op", 1.0) == 1  # forgotten: written again
    assert throttle.admit("d", "op", 1.0) is None


def test_quotagate_prune_from_the_cli(db_url: str, tmp_path: Path) -> None:
    clock = ManualClock(start=time.time() - 40 * DAY)
    with Quotagate.connect(db_url, clock=clock) as gate:
        gate.set_tenant("team-a", {"gpu": 4})
        gate.set_pool("pool-1", {"gpu": 4})
        gate.submit("old-done", "team-a", {"gpu": 1})
        gate.submit("old-waiting", "team-a", {"gpu": 4})  # 3 left after old-done: waiting
        gate.admit_until_idle()
        gate.complete("old-done")
    answer = run("prune", "--older-than", "30d", db=db_url, cwd=tmp_path)
    assert "pruned 1 requests" in answer.stdout
    assert "pruned 1 requests" in answer.stderr  # progress, batch by batch
    with Quotagate.connect(db_url) as gate:
        assert _state(gate, "old-done") is None
        assert _state(gate, "old-waiting") == "waiting"
    nothing = run("prune", "--older-than", "30d", db=db_url, cwd=tmp_path)
    assert "pruned 0 requests" in nothing.stdout
    bad = run("prune", "--older-than", "soon", db=db_url, cwd=tmp_path, expect=2)
    assert "invalid_duration" in bad.stderr or "duration" in bad.stderr
