"""The delivery engine on every SQL backend: concurrency, batches, stops, identity.

Real ``quotagate worker`` processes, a real webhook receiver on 127.0.0.1, real
commands and real SIGKILL (docs/delivery.md).
"""

from __future__ import annotations

import json
import signal
import stat
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate, RequestState, StaleGeneration
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.naming import external_name
from quotagate.delivery.registry import TargetStore
from quotagate.delivery.targets.base import ExternalObject
from quotagate.store import schema
from support.process_runs import alive, delivered_run, process_target, run_directories, running_group
from support.receiver import Receiver
from support.waiting import wait_for
from support.worker_processes import finish, start_worker, stop_all, submit_and_admit, table


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 1000})
    gate.set_pool("pool-1", {"gpu": 1000})
    return gate


def used(gate: Quotagate) -> int:
    return int(gate.usage()["tenants"][0]["used"])


def releases(gate: Quotagate, request_id: str) -> int:
    return sum(1 for row in table(gate, schema.audit)
               if row["target"] == request_id and row["outcome"] == "released")


def snapshot(gate: Quotagate) -> list[list[Any]]:
    return [sorted(map(tuple, (r.values() for r in table(gate, which))))
            for which in (schema.request, schema.outbox, schema.binding, schema.audit)]


def webhook_target(gate: Quotagate, url: str) -> None:
    TargetStore(gate.engine).set("hook", "webhook", {"url": url}, default=True)


def delivered_to_webhook(gate: Quotagate, receiver: Receiver) -> tuple[str, Dispatcher]:
    """One request delivered to ``receiver`` by a worker polling stops every 50 ms."""
    webhook_target(gate, receiver.url)
    [request_id] = submit_and_admit(gate, 1)
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.05)
    dispatcher.run_once()
    return request_id, dispatcher


# -- throughput paths under concurrency -----------------------------------------------


def test_several_concurrent_workers_never_deliver_one_request_twice_at_once(
    ledger: Quotagate, db_url: str, receiver: Receiver
) -> None:
    receiver.initial_state = "completed"
    receiver.post_delay = 0.02  # long enough for concurrent attempts to overlap
    webhook_target(ledger, receiver.url)
    ids = submit_and_admit(ledger, 60)
    # A long lease: this test is about concurrent claims, not takeovers.
    workers = [start_worker(db_url, f"w{n}", "--concurrency", "8", "--batch", "8",
                            "--lease-ttl", "10") for n in range(3)]
    try:
        wait_for(lambda: all(ledger.show(i).state == RequestState.COMPLETED for i in ids),
                 "every request to complete", timeout=120)
    finally:
        stop_all(workers)
    assert sorted(receiver.objects) == sorted(b["external_name"]
                                              for b in table(ledger, schema.binding))
    assert set(receiver.most_in_flight.values()) == {1}  # never two POSTs of one key at once
    posts = Counter(call["headers"]["Idempotency-Key"] for call in receiver.calls_of("POST"))
    assert posts == Counter(ids)  # and each request was POSTed exactly once
    assert used(ledger) == 0 and ledger.check_invariants() == []


def test_a_stale_generations_batch_writes_nothing(ledger: Quotagate, tmp_path: Path) -> None:
    process_target(ledger, tmp_path, "true")
    submit_and_admit(ledger, 3)
    old = Dispatcher(ledger, worker_name="w1", lease_ttl=0.3)
    assert old._hold_lease() and old.lease is not None
    claims = old.outbox.claim(old.lease, 10)
    assert len(claims) == 3
    # The old process stalls; a new process of the same name takes the lease over.
    new = Dispatcher(ledger, worker_name="w1")
    wait_for(new._hold_lease, "the takeover")
    before = snapshot(ledger)
    batch = [(claim, "local", ExternalObject(f"name-{claim.request_id}", "uid", claim.request_id))
             for claim in claims]
    with pytest.raises(StaleGeneration):
        old.outbox.record_deliveries(old.lease, batch, actor="late")
    assert snapshot(ledger) == before
    # A batch whose lease is current but one of whose claims was taken over
    # writes the others and leaves that one out.
    fresh = new.outbox.claim(new.lease, 10) if new.lease is not None else []
    assert len(fresh) == 3
    other = Dispatcher(ledger, worker_name="w2")
    assert other._hold_lease() and other.lease is not None
    stolen = fresh[0]
    with ledger.engine.begin() as connection:  # as if w1's claim on it had died
        connection.execute(schema.outbox.update()
                           .where(schema.outbox.c.request_id == stolen.request_id)
                           .values(claimed_by="w2", claim_generation=other.lease.generation,
                                   claim_token=stolen.fencing_token + 1))
    assert new.lease is not None
    written = new.outbox.record_deliveries(new.lease, [
        (claim, "local", ExternalObject(f"name-{claim.request_id}", "uid", claim.request_id))
        for claim in fresh
    ], actor="test")
    assert written.lost == [stolen.request_id]
    assert sorted(written.delivered) == sorted(c.request_id for c in fresh[1:])
    assert ledger.show(stolen.request_id).state == RequestState.RESERVED
    assert stolen.request_id not in {b["request_id"] for b in table(ledger, schema.binding)}


# -- fencing tokens ---------------------------------------------------------------------


def test_fencing_tokens_grow_across_workers_takeovers_and_stops(
    ledger: Quotagate, tmp_path: Path
) -> None:
    process_target(ledger, tmp_path, "true")
    [request_id] = submit_and_admit(ledger, 1)
    tokens = []
    first = Dispatcher(ledger, worker_name="w1", lease_ttl=0.3)
    assert first._hold_lease() and first.lease is not None
    [claim] = first.outbox.claim(first.lease, 10)
    tokens.append(claim.fencing_token)
    # w1 dies silently: its claim dies with its lease; w2 takes it.
    second = Dispatcher(ledger, worker_name="w2")
    assert second._hold_lease() and second.lease is not None
    lease = second.lease
    [claim] = wait_for(lambda: second.outbox.claim(lease, 10), "w1's lease to expire")
    tokens.append(claim.fencing_token)
    second.outbox.record_failure(claim, "refused", 0.0)
    # w1 restarts under its own name (a new generation) and claims the retry.
    restarted = Dispatcher(ledger, worker_name="w1")
    wait_for(restarted._hold_lease, "w1's new lease")
    assert restarted.lease is not None
    [claim] = wait_for(lambda: restarted.outbox.claim(restarted.lease, 10), "the retry")  # type: ignore[arg-type]
    tokens.append(claim.fencing_token)
    restarted.outbox.record_failure(claim, "refused", 0.0)
    # Cancelled: the stop's claims carry the sequence on.
    ledger.cancel(request_id)
    [claim] = second.outbox.claim(lease, 10, stops=True)
    tokens.append(claim.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens


# -- stops -----------------------------------------------------------------------------


def test_cancelling_a_running_process_stops_it_and_returns_the_cost_once(
    ledger: Quotagate, tmp_path: Path
) -> None:
    process_target(ledger, tmp_path, "sleep 60")
    [request_id] = submit_and_admit(ledger, 1)
    dispatcher = Dispatcher(ledger, worker_name="w1", stop_poll=0.05)
    dispatcher.run_once()
    [run] = run_directories(tmp_path)
    group = running_group(run)
    assert alive(group)
    result = ledger.cancel(request_id, actor="tenant:team-a")
    assert result.request.state == RequestState.CANCELLING and result.released == {}
    assert used(ledger) == 1 and ledger.check_invariants() == []  # still charged
    assert ledger.inspect()["requests"][0]["outbox"] == "stopping"

    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.CANCELLED, "the stop")
    assert not alive(group)
    assert (run / "exit_status").read_text() == str(-signal.SIGTERM)
    assert used(ledger) == 0 and releases(ledger, request_id) == 1
    dispatcher.run_once()  # asking again changes nothing
    assert releases(ledger, request_id) == 1 and ledger.check_invariants() == []
    dispatcher.release()


def test_a_command_ignoring_sigterm_is_killed_after_the_grace_period(
    ledger: Quotagate, tmp_path: Path
) -> None:
    process_target(ledger, tmp_path, "trap '' TERM; sleep 60", stop_grace=0.5)
    request_id, dispatcher, run = delivered_run(ledger, tmp_path, "pid")
    ledger.cancel(request_id)
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.CANCELLED, "the SIGKILL")
    assert (run / "exit_status").read_text() == str(-signal.SIGKILL)
    assert used(ledger) == 0 and releases(ledger, request_id) == 1
    dispatcher.release()


GRACEFUL_COMMAND = """
import pathlib, signal, sys, time
run = pathlib.Path.cwd()
def on_term(*_):
    with open(run / "terms", "a") as terms:
        terms.write("TERM\\n")
signal.signal(signal.SIGTERM, on_term)
(run / "ready").write_text("")
while not (run / "terms").exists() or not (run / "shut-down").exists():
    time.sleep(0.01)  # the shutdown it takes its time over, until the test lets it end
sys.exit(0)
"""


def test_a_stop_asked_again_sends_sigterm_once_so_the_command_shuts_down_itself(
    ledger: Quotagate, tmp_path: Path
) -> None:
    script = tmp_path / "graceful.py"
    script.write_text(GRACEFUL_COMMAND)
    process_target(ledger, tmp_path, f"exec {sys.executable} {script}", stop_grace=600)
    request_id, dispatcher, run = delivered_run(ledger, tmp_path, "ready")
    ledger.cancel(request_id)
    wait_for(lambda: dispatcher.run_once() is not None and (run / "terms").exists(),
             "the SIGTERM")
    # Asked again while the command shuts down: three more stop attempts.
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.inspect()["requests"][0]["attempts"] >= 4, "the stop asked again")
    (run / "shut-down").write_text("")
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.CANCELLED, "the stop")
    assert (run / "terms").read_text() == "TERM\n"  # one SIGTERM, however often it was asked
    assert (run / "exit_status").read_text() == "0"  # it ended itself: no SIGKILL
    assert used(ledger) == 0 and releases(ledger, request_id) == 1
    dispatcher.release()


def test_a_run_stopped_before_its_command_started_never_runs(
    ledger: Quotagate, tmp_path: Path
) -> None:
    log = tmp_path / "ran.log"
    process_target(ledger, tmp_path, f"echo ran >> {log}")
    [request_id] = submit_and_admit(ledger, 1)
    ledger.cancel(request_id)  # reserved, not delivered yet
    dispatcher = Dispatcher(ledger, worker_name="w1")
    dispatcher.run_once()
    assert ledger.show(request_id).state == RequestState.CANCELLED
    assert run_directories(tmp_path) == [] and not log.exists()
    assert used(ledger) == 0 and releases(ledger, request_id) == 1
    dispatcher.release()


def test_stopping_a_webhook_object_deletes_it_with_fencing_headers_and_returns_once(
    ledger: Quotagate, receiver: Receiver
) -> None:
    request_id, dispatcher = delivered_to_webhook(ledger, receiver)
    assert ledger.show(request_id).state == RequestState.DELIVERED
    receiver.delete_answers = [202, 202]  # "stopping", twice; then confirmed
    ledger.cancel(request_id)
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.CANCELLED, "the stop")
    deletes = receiver.calls_of("DELETE")
    assert len(deletes) == 3
    assert {call["headers"]["Idempotency-Key"] for call in deletes} == {request_id}
    assert {call["headers"]["Quotagate-Ledger"] for call in deletes} == {ledger.ledger_id}
    tokens = [int(call["headers"]["Quotagate-Fencing-Token"]) for call in deletes]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3  # each poll a newer claim
    [binding] = table(ledger, schema.binding)
    assert tokens[0] > binding["fencing_token"]
    assert used(ledger) == 0 and releases(ledger, request_id) == 1
    dispatcher.release()


def test_a_stop_the_executor_never_confirms_keeps_the_cost_charged(
    ledger: Quotagate, receiver: Receiver
) -> None:
    request_id, dispatcher = delivered_to_webhook(ledger, receiver)
    receiver.never_confirm_stop = True
    ledger.cancel(request_id)
    wait_for(lambda: dispatcher.run_once() is not None
             and len(receiver.calls_of("DELETE")) >= 5, "several stop attempts")
    assert ledger.show(request_id).state == RequestState.CANCELLING
    assert used(ledger) == 1 and releases(ledger, request_id) == 0
    assert ledger.check_invariants() == []
    [shown] = ledger.inspect()["requests"]
    # The receiver's 202 is a stop under way, not a failure (docs/decisions/823).
    assert shown["outbox"] == "stopping" and "stopping it" in shown["stop_progress"]
    assert shown["last_error"] is None
    explained = ledger.explain(request_id)
    assert explained["state"] == "cancelling" and explained["stop_attempts"] >= 5
    assert "stopping it" in explained["last_answer"]
    as_tenant = ledger.views.explain(request_id, tenant="team-a")
    assert "still charged" in as_tenant["reason"] and "last_answer" not in as_tenant
    # Nobody else can end it early either: complete/fail are refused while cancelling.
    with pytest.raises(Exception, match="cancelling"):
        ledger.complete(request_id)
    assert used(ledger) == 1
    dispatcher.release()


# -- identity ----------------------------------------------------------------------------


def test_two_ledgers_sharing_a_run_directory_never_adopt_each_others_objects(
    ledger: Quotagate, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    command = f'echo "$QUOTAGATE_REQUEST_ID" >> {log}'
    process_target(ledger, tmp_path, command)
    with Quotagate.connect(f"sqlite:///{tmp_path / 'other.db'}", clock=ManualClock()) as other:
        other.init()
        assert other.ledger_id != ledger.ledger_id
        other.set_tenant("team-a", {"gpu": 10})
        other.set_pool("pool-1", {"gpu": 10})
        process_target(other, tmp_path, command)
        for gate in (ledger, other):
            submit_and_admit(gate, 1)  # the same request id, "job-000", in both
            dispatcher = Dispatcher(gate, worker_name="w1")
            wait_for(lambda gate=gate, dispatcher=dispatcher: dispatcher.run_once() is not None
                     and gate.show("job-000").state == RequestState.COMPLETED, "completion")
            dispatcher.release()
        # Two objects, two runs: neither ledger took the other's run for its own.
        runs = run_directories(tmp_path)
        assert len(runs) == 2
        assert {json.loads((run / "request.json").read_text())["ledger_id"] for run in runs} == {
            ledger.ledger_id, other.ledger_id}
        assert log.read_text().split() == ["job-000", "job-000"]

        # An object of the other ledger under this ledger's name fails loudly.
        theirs = runs[0] if json.loads((runs[0] / "request.json").read_text())[
            "ledger_id"] == other.ledger_id else runs[1]
        squatted = tmp_path / "runs" / external_name(ledger.ledger_id, "team-a", "job-001")
        squatted.mkdir()
        spec = json.loads((theirs / "request.json").read_text())
        (squatted / "request.json").write_text(json.dumps({**spec, "request_id": "job-001"}))
        ledger.submit("job-001", "team-a", {"gpu": 1})
        ledger.admit()
        dispatcher = Dispatcher(ledger, worker_name="w1")
        dispatcher.run_once()
        dispatcher.release()
        failed = ledger.show("job-001")
        assert failed.state == RequestState.FAILED
        assert failed.reason == "delivery failed: external identity mismatch"
        assert not (squatted / "started").exists()  # nothing was run
        assert log.read_text().split() == ["job-000", "job-000"]


def test_the_ledger_id_is_kept_in_the_database(db_url: str) -> None:
    with Quotagate.connect(db_url) as first, Quotagate.connect(db_url) as second:
        assert first.ledger_id == second.ledger_id
        assert len(first.ledger_id) == 32
    with Quotagate.connect(db_url) as gate, gate.engine.begin() as connection:
        connection.execute(schema.ledger_meta.delete())  # a ledger from before the id
    with Quotagate.connect(db_url) as first, Quotagate.connect(db_url) as second:
        assert first.ledger_id == second.ledger_id  # created on first use, once


# -- crashes -----------------------------------------------------------------------------


def test_a_killed_workers_claims_go_to_a_differently_named_worker_after_its_lease(
    ledger: Quotagate, db_url: str, tmp_path: Path
) -> None:
    process_target(ledger, tmp_path, "true")
    ids = submit_and_admit(ledger, 2)
    assert finish(start_worker(db_url, "w1", "--batch", "1", crash_at="after_claim")) == (
        -signal.SIGKILL)
    [claimed] = [row for row in table(ledger, schema.outbox) if row["claimed_by"] == "w1"]
    killed_at = time.monotonic()
    # Lease TTL 2 s and poll 0.05 s (FAST_OPTIONS): the old claim TTL was 120 s.
    other = start_worker(db_url, "other-host", "--until-idle")
    assert finish(other, timeout=60) == 0
    assert time.monotonic() - killed_at < 60
    assert {ledger.show(i).state for i in ids} == {RequestState.COMPLETED}
    bindings = {row["request_id"]: row for row in table(ledger, schema.binding)}
    assert bindings[claimed["request_id"]]["fencing_token"] == claimed["claim_token"] + 1
    assert used(ledger) == 0 and ledger.check_invariants() == []


@pytest.mark.parametrize("crash_at", ["after_claim", "after_create", "after_binding"])
def test_a_webhook_worker_killed_at_each_step_is_replaced_and_delivers_exactly_once(
    ledger: Quotagate, db_url: str, receiver: Receiver, crash_at: str
) -> None:
    receiver.initial_state = "completed"
    webhook_target(ledger, receiver.url)
    ids = submit_and_admit(ledger, 3)
    assert finish(start_worker(db_url, "w1", "--batch", "2", crash_at=crash_at)) == (
        -signal.SIGKILL)
    bindings = table(ledger, schema.binding)
    if crash_at == "after_claim":
        assert receiver.objects == {} and bindings == []
    elif crash_at == "after_create":
        assert len(receiver.objects) >= 1 and bindings == []  # the reply was "lost"
    else:
        assert len(receiver.objects) == len(bindings) == 2
    assert finish(start_worker(db_url, "w1", "--until-idle")) == 0
    assert {ledger.show(i).state for i in ids} == {RequestState.COMPLETED}
    bindings = table(ledger, schema.binding)
    assert sorted(receiver.objects) == sorted(b["external_name"] for b in bindings)
    assert {b["uid"] for b in bindings} == {o["id"] for o in receiver.objects.values()}
    created = Counter(o["request_id"] for o in receiver.objects.values())
    assert created == Counter(ids)  # one object per request, whatever was retried
    assert all(releases(ledger, i) == 1 for i in ids)
    assert used(ledger) == 0 and ledger.check_invariants() == []


# -- what an executor and a tenant see ------------------------------------------------------


def test_a_process_run_sees_only_its_allowed_environment_in_private_files(
    ledger: Quotagate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUOTAGATE_DB", "postgresql://admin:hunter2@db/ledger")
    monkeypatch.setenv("QUOTAGATE_RATE_STORE", "redis://:hunter2@cache/0")
    monkeypatch.setenv("MODEL_CACHE", "/models")
    monkeypatch.setenv("UNRELATED_SECRET", "hunter2")
    process_target(ledger, tmp_path, 'env > "$QUOTAGATE_RUN_DIR/env.txt"',
                   environment=["MODEL_CACHE"])
    [request_id] = submit_and_admit(ledger, 1)
    dispatcher = Dispatcher(ledger, worker_name="w1")
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.COMPLETED, "the run")
    dispatcher.release()
    [run] = run_directories(tmp_path)
    seen = dict(line.split("=", 1) for line in (run / "env.txt").read_text().splitlines()
                if "=" in line)
    # sh adds PWD, SHLVL and "_" itself; everything else came from the allow-list.
    assert set(seen) - {"PWD", "SHLVL", "_", "OLDPWD"} <= {
        "PATH", "HOME", "LANG", "MODEL_CACHE", "QUOTAGATE_REQUEST_ID", "QUOTAGATE_TENANT",
        "QUOTAGATE_FENCING_TOKEN", "QUOTAGATE_PAYLOAD", "QUOTAGATE_RUN_DIR",
        "QUOTAGATE_ATTEMPT",
    }
    assert seen["MODEL_CACHE"] == "/models" and seen["QUOTAGATE_REQUEST_ID"] == request_id
    assert "hunter2" not in (run / "env.txt").read_text()
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    for name in ("request.json", "output.log", "exit_status", "env.txt", "started"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o600, name


def test_tenant_visible_reasons_carry_no_secrets_and_admins_see_the_redacted_detail(
    ledger: Quotagate, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    port = receiver.server_address[1]
    url = f"http://hookuser:pa55word@127.0.0.1:{port}/hooks?token=s3cret"
    webhook_target(ledger, url)
    receiver.post_status = 500
    receiver.post_body = {"error": "database password is XYZZY"}
    [request_id] = submit_and_admit(ledger, 1)
    dispatcher = Dispatcher(ledger, worker_name="w1", max_attempts=2, retry_base=0.05)
    dispatcher.run_once()
    [shown] = ledger.inspect()["requests"]  # the admin view: detail, redacted
    assert "answered 500" in shown["last_error"] and "token=***" in shown["last_error"]
    wait_for(lambda: dispatcher.run_once() is not None
             and ledger.show(request_id).state == RequestState.FAILED, "the give-up")
    dispatcher.release()
    failed = ledger.show(request_id)
    assert failed.reason == "delivery failed after 2 attempts: webhook answered 500"
    tenant_audit = [row["reason"] or "" for row in table(ledger, schema.audit)
                    if row["tenant"] == "team-a"]
    for text in [*tenant_audit, shown["last_error"], caplog.text]:
        for secret in ("pa55word", "s3cret", "XYZZY", "hookuser"):
            assert secret not in text, (secret, text)


def test_due_rows_are_judged_by_the_database_clock(ledger: Quotagate, tmp_path: Path) -> None:
    process_target(ledger, tmp_path, "true")
    [request_id] = submit_and_admit(ledger, 1)
    # The admitting process's clock was far ahead (ManualClock is in 2027).
    with ledger.engine.begin() as connection:
        connection.execute(schema.outbox.update().values(next_attempt_at=time.time() + 3600))
    dispatcher = Dispatcher(ledger, worker_name="w1")
    dispatcher.run_once()  # a first attempt is due at once, whoever wrote the row
    assert ledger.show(request_id).state in (RequestState.DELIVERED, RequestState.COMPLETED)
    dispatcher.release()
    with ledger.engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(
            schema.binding)).scalar_one() == 1
