"""The outbox dispatcher over SQLite, PostgreSQL and MariaDB, with the process target.

Fencing: a worker generation replaced by a takeover (even under the same name)
and a worker whose claim expired and was taken over both have their writes
refused, counted, and without effect.
"""

from __future__ import annotations

import json
import time
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
from quotagate.store.outbox import Claim
from support.waiting import wait_for

# Appends one line per run to a shared log; a payload containing "fail" exits 3.
COMMAND = (
    'echo "$QUOTAGATE_REQUEST_ID $QUOTAGATE_TENANT $QUOTAGATE_FENCING_TOKEN '
    '$QUOTAGATE_PAYLOAD" >> "$LOG"; case "$QUOTAGATE_PAYLOAD" in *fail*) exit 3;; esac'
)


@pytest.fixture
def ledger(gate: Quotagate, tmp_path: Path) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 8})
    log = tmp_path / "runs.log"
    TargetStore(gate.engine, clock=gate.clock).set(
        "local", "process",
        {"command": ["sh", "-c", COMMAND.replace("$LOG", str(log))],
         "run_dir": str(tmp_path / "runs")},
        default=True,
    )
    return gate


def runs_log(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "runs.log"
    return [line.split(" ", 3) for line in path.read_text().splitlines()] if path.exists() else []


def rows(gate: Quotagate, table: sa.Table) -> list[Any]:
    with gate.engine.connect() as connection:
        return list(connection.execute(sa.select(table)).mappings())


def run_directories(tmp_path: Path) -> list[Path]:
    return [path for path in (tmp_path / "runs").iterdir() if not path.name.startswith(".")]


def state(gate: Quotagate, request_id: str) -> RequestState:
    return gate.show(request_id).state


def settle(dispatcher: Dispatcher, gate: Quotagate, ids: list[str]) -> None:
    """Run passes until every request has ended (the commands run asynchronously)."""

    def ended() -> bool:
        dispatcher.run_once()
        return all(state(gate, i) in (RequestState.COMPLETED, RequestState.FAILED) for i in ids)

    wait_for(ended, "every request to end")


def test_process_target_runs_each_request_once_and_its_exit_releases_the_cost(
    ledger: Quotagate, tmp_path: Path
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 1}, payload={"model": "m1"})
    ledger.submit("job-2", "team-a", {"gpu": 2}, payload={"model": "fail"})
    assert len(ledger.admit(10)) == 2
    dispatcher = Dispatcher(ledger, worker_name="w1", lease_ttl=30)
    assert dispatcher.run_once() >= 2
    # Delivered, bound, charged: the commands may still be running.
    for request_id in ("job-1", "job-2"):
        assert state(ledger, request_id) in (RequestState.DELIVERED, RequestState.COMPLETED,
                                             RequestState.FAILED)
    settle(dispatcher, ledger, ["job-1", "job-2"])
    assert state(ledger, "job-1") == RequestState.COMPLETED
    failed = ledger.show("job-2")
    assert failed.state == RequestState.FAILED and failed.reason == "command exited with status 3"
    assert ledger.usage()["tenants"][0]["used"] == 0
    assert ledger.check_invariants() == []

    bindings = {row["request_id"]: row for row in rows(ledger, schema.binding)}
    assert set(bindings) == {"job-1", "job-2"}
    assert bindings["job-1"]["external_name"] == external_name(ledger.ledger_id, "team-a", "job-1")
    assert bindings["job-1"]["fencing_token"] == 1 and bindings["job-1"]["uid"]
    log = runs_log(tmp_path)
    assert sorted(entry[0] for entry in log) == ["job-1", "job-2"]  # each ran exactly once
    assert {entry[0]: (entry[1], entry[2], json.loads(entry[3])) for entry in log}["job-1"] == (
        "team-a", "1", {"model": "m1"}
    )
    assert sorted(p.name for p in run_directories(tmp_path)) == sorted(
        b["external_name"] for b in bindings.values()
    )
    # Running again does nothing more: no second run, no second release.
    dispatcher.run_once()
    assert len(runs_log(tmp_path)) == 2
    # Recorded ends leave the .exited index (it holds only ends still to record);
    # the run directories and their exit status stay.
    assert list((tmp_path / "runs" / ".exited").iterdir()) == []
    assert all((path / "exit_status").exists() for path in run_directories(tmp_path))
    dispatcher.release()
    assert dispatcher.leases.get("worker/w1").owner is None


def test_a_request_names_its_target_and_one_without_a_default_waits_with_the_error(
    ledger: Quotagate, tmp_path: Path, clock: ManualClock
) -> None:
    targets = TargetStore(ledger.engine, clock=ledger.clock)
    targets.set("other", "process", {"command": ["true"], "run_dir": str(tmp_path / "other")})
    ledger.submit("named", "team-a", {"gpu": 1}, target="other")
    with ledger.engine.begin() as connection:
        connection.execute(schema.delivery_target.update().values(is_default=False))
    ledger.submit("unnamed", "team-a", {"gpu": 1})
    ledger.admit(10)
    dispatcher = Dispatcher(ledger, worker_name="w1", max_attempts=3)
    dispatcher.run_once()
    assert (tmp_path / "other" / external_name(ledger.ledger_id, "team-a", "named")).is_dir()
    assert state(ledger, "named") in (RequestState.DELIVERED, RequestState.COMPLETED)
    outbox = {row["request_id"]: row for row in rows(ledger, schema.outbox)}
    assert outbox["unnamed"]["attempts"] == 1
    assert "no_default_target" in outbox["unnamed"]["last_error"]
    # Retries are due by the database clock (docs/decisions/212), not the app's.
    assert abs(outbox["unnamed"]["next_attempt_at"] - (time.time() + 1.0)) < 5
    assert state(ledger, "unnamed") == RequestState.RESERVED  # still charged, still promised
    assert ledger.check_invariants() == []


def test_after_the_last_attempt_the_request_fails_and_its_cost_returns_once(
    ledger: Quotagate,
) -> None:
    with ledger.engine.begin() as connection:
        connection.execute(schema.delivery_target.update().values(is_default=False))
    ledger.submit("job-1", "team-a", {"gpu": 3})
    ledger.admit()
    dispatcher = Dispatcher(ledger, worker_name="w1", max_attempts=3, retry_base=1.0)

    def attempts() -> list[int]:
        assert ledger.usage()["tenants"][0]["used"] in (0, 3)  # never charged twice
        return [row["attempts"] for row in rows(ledger, schema.outbox)]

    dispatcher.run_once()
    assert attempts() == [1]
    dispatcher.run_once()
    assert attempts() == [1]  # backoff 1 s by the database clock: too early
    wait_for(lambda: dispatcher.run_once() is not None and attempts() == [2], "a 2nd attempt")
    wait_for(lambda: dispatcher.run_once() is not None and attempts() == [], "the give-up")
    failed = ledger.show("job-1")
    assert failed.state == RequestState.FAILED
    assert failed.reason is not None and "after 3 attempts" in failed.reason
    assert "no default target" in failed.reason  # the last error, as a tenant may see it
    assert ledger.usage()["tenants"][0]["used"] == 0
    assert ledger.check_invariants() == []


def test_an_object_of_another_request_under_our_name_fails_the_request_loudly(
    ledger: Quotagate, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    squatter = tmp_path / "runs" / external_name(ledger.ledger_id, "team-a", "job-1")
    squatter.mkdir(parents=True)
    (squatter / "request.json").write_text(json.dumps({"request_id": "someone-else", "uid": "x",
                                                          "ledger_id": ledger.ledger_id}))
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    Dispatcher(ledger, worker_name="w1").run_once()
    failed = ledger.show("job-1")
    assert failed.state == RequestState.FAILED
    # The tenant learns that it failed, not whose object is in the way; the log does.
    assert failed.reason == "delivery failed: external identity mismatch"
    assert "someone-else" in caplog.text
    assert rows(ledger, schema.binding) == []
    assert ledger.usage()["tenants"][0]["used"] == 0


def _snapshot(gate: Quotagate) -> list[list[Any]]:
    return [sorted(map(tuple, (r.values() for r in rows(gate, table))))
            for table in (schema.request, schema.outbox, schema.binding, schema.lease)]


def test_a_takeover_by_the_same_name_fences_every_write_of_the_old_generation(
    ledger: Quotagate, tmp_path: Path
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    old = Dispatcher(ledger, worker_name="w1", lease_ttl=0.3)
    assert old._hold_lease()
    assert old.lease is not None and old.lease.generation == 1
    [claim] = old.outbox.claim(old.lease, 10)
    # The old process stalls; its lease runs out; a new process of the same name starts.
    new = Dispatcher(ledger, worker_name="w1", lease_ttl=30)
    wait_for(new._hold_lease, "the takeover")
    assert new.lease is not None and new.lease.generation == 2

    before = _snapshot(ledger)
    stale_before = ledger.delivery_counters.snapshot()["stale_writes"]
    obtained = ExternalObject(external_name(ledger.ledger_id, "team-a", "job-1"), "uid-1", "job-1")
    for late_write in (
        lambda: old.outbox.record_binding(claim, "local", obtained),
        lambda: old.outbox.mark_delivered(claim, actor="test"),
        lambda: old.outbox.record_failure(claim, "late", 0.0),
        lambda: old.outbox.claim(claim.lease, 10),
        lambda: ledger.ledger.release("job-1", RequestState.FAILED, fence=old.outbox.fence(claim)),
    ):
        with pytest.raises(StaleGeneration) as error:
            late_write()
        assert error.value.code == "stale_generation"
    assert ledger.delivery_counters.snapshot()["stale_writes"] == stale_before + 5
    assert _snapshot(ledger) == before  # the old generation changed nothing

    # The new generation reclaims its predecessor's row at once (no claim expiry wait).
    assert new.run_once() >= 1
    assert state(ledger, "job-1") in (RequestState.DELIVERED, RequestState.COMPLETED)
    [binding] = rows(ledger, schema.binding)
    assert binding["fencing_token"] == 2  # a later attempt carries a larger token


def test_a_claim_dies_with_its_lease_and_the_taker_fences_the_slow_worker(
    ledger: Quotagate,
) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    # Long enough that the steps up to the first claim below end within it on a loaded
    # machine (0.3 s expired first once on MariaDB); its expiry is then waited for.
    slow = Dispatcher(ledger, worker_name="slow", lease_ttl=3.0)
    assert slow._hold_lease() and slow.lease is not None
    [claim] = slow.outbox.claim(slow.lease, 10)
    fast = Dispatcher(ledger, worker_name="fast")
    assert fast._hold_lease() and fast.lease is not None
    lease = fast.lease
    assert fast.outbox.claim(lease, 10) == []  # held while the slow worker's lease lives
    # The slow worker stops renewing; once its lease expires its claim is free.
    taken: list[Claim] = wait_for(lambda: fast.outbox.claim(lease, 10), "lease expiry")
    assert taken[0].fencing_token == claim.fencing_token + 1

    before = _snapshot(ledger)
    with pytest.raises(StaleGeneration) as error:
        slow.outbox.mark_delivered(claim, actor="test")
    assert error.value.code == "claim_lost"
    assert _snapshot(ledger) == before
    fast.outbox.mark_delivered(taken[0], actor="test")
    assert state(ledger, "job-1") == RequestState.DELIVERED
    assert ledger.check_invariants() == []


def test_a_cancelled_request_is_not_delivered(ledger: Quotagate, tmp_path: Path) -> None:
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    cancelled = ledger.cancel("job-1")
    # Reserved: a stop, charged until a worker confirms nothing runs.
    assert cancelled.request.state == RequestState.CANCELLING and cancelled.released == {}
    assert ledger.usage()["tenants"][0]["used"] == 1
    assert ledger.check_invariants() == []
    Dispatcher(ledger, worker_name="w1").run_once()
    assert not (tmp_path / "runs").exists() or run_directories(tmp_path) == []
    assert state(ledger, "job-1") == RequestState.CANCELLED
    assert ledger.usage()["tenants"][0]["used"] == 0
    assert rows(ledger, schema.outbox) == [] and rows(ledger, schema.binding) == []


def test_outcomes_are_watched_page_by_page_until_every_request_ended(
    ledger: Quotagate, tmp_path: Path
) -> None:
    ids = [f"job-{n}" for n in range(3)]
    for request_id in ids:
        ledger.submit(request_id, "team-a", {"gpu": 1})
    ledger.admit(10)
    dispatcher = Dispatcher(ledger, worker_name="w1", observe_limit=1)
    settle(dispatcher, ledger, ids)
    assert {state(ledger, i) for i in ids} == {RequestState.COMPLETED}
    assert ledger.check_invariants() == []


class _EndsAtOnce:
    """A target whose objects have all ended (``ends``) or all still run; counts the reads."""

    def __init__(self, ends: bool) -> None:
        self.ends = ends
        self.reads: list[int] = []

    def create_if_absent(self, spec: Any) -> ExternalObject:
        return ExternalObject(spec.external_name, "uid", spec.request_id, created_now=True)

    def outcomes(self, objects: Any) -> dict[str, Any]:
        from quotagate.delivery.targets.base import Outcome

        self.reads.append(len(objects))
        return {obtained.request_id: Outcome(completed=True) for obtained in objects} \
            if self.ends else {}


@pytest.mark.parametrize("ends", [True, False], ids=["page-ended", "nothing-ended"])
def test_a_delivering_pass_reads_outcomes_again_after_a_full_page_that_ended(
    ledger: Quotagate, monkeypatch: pytest.MonkeyPatch, ends: bool
) -> None:
    """While batches keep coming, outcome reads are spaced (decisions 217, 249), unless
    the last read was a full page that ended at least half of it (docs/decisions/251)."""
    from quotagate.delivery import dispatcher as dispatching

    # No pass here is a second after another, however slow the machine.
    monkeypatch.setattr(dispatching, "OBSERVE_INTERVAL", 3600.0)
    ledger.set_tenant("team-a", {"gpu": 100})
    ledger.set_pool("pool-1", {"gpu": 100})
    dispatcher = Dispatcher(ledger, worker_name="w1", observe_limit=2)
    config, _process = dispatcher.built.get(None)
    target = _EndsAtOnce(ends)
    monkeypatch.setattr(dispatcher.built, "get", lambda _name: (config, target))
    for index in range(4):
        ledger.submit(f"job-{index}", "team-a", {"gpu": 1})
    ledger.admit(10)
    dispatcher.run_once()  # delivers 4, then its first read: a full page of 2
    assert target.reads == [2]
    ledger.submit("job-4", "team-a", {"gpu": 1})
    ledger.admit(10)
    dispatcher.run_once()  # delivers 1: reads again only if the first read ended its page
    assert target.reads == ([2, 2] if ends else [2])
    ended = {i for i in (f"job-{n}" for n in range(5)) if state(ledger, i) == RequestState.COMPLETED}
    assert len(ended) == (4 if ends else 0)
    assert ledger.check_invariants() == []


def test_a_stop_under_way_is_progress_not_a_failure(ledger: Quotagate, tmp_path: Path) -> None:
    """A stop the target is carrying out ("SIGTERM sent") keeps its answer as the stop's
    progress: the dashboard, the request's story and ``inspect`` do not call it failing
    (docs/decisions/823). Before, the answer went to ``last_error`` and read as a failure."""
    started = tmp_path / "started"
    TargetStore(ledger.engine, clock=ledger.clock).set(
        "slow", "process",
        {"command": ["sh", "-c", f'touch "{started}"; sleep 30'],
         "run_dir": str(tmp_path / "runs")},
        default=True,
    )
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    dispatcher = Dispatcher(ledger, worker_name="w1", lease_ttl=30)
    dispatcher.run_once()
    wait_for(started.exists, "the command to start")
    assert ledger.cancel("job-1").request.state == RequestState.CANCELLING
    dispatcher.run_once()  # sends SIGTERM; the exit is confirmed by a later pass
    assert state(ledger, "job-1") == RequestState.CANCELLING
    progress = "SIGTERM sent, waiting for the exit"
    [stop] = ledger.dashboard().stops
    assert (stop.attempts, stop.failing, stop.last_error, stop.progress) == (
        1, False, None, progress)
    [hidden] = ledger.dashboard("team-a").stops
    assert (hidden.failing, hidden.progress) == (False, None)
    story = ledger.request_story("job-1")["delivery"]
    assert (story["failing"], story["last_error"], story["stop_progress"]) == (
        False, None, progress)
    assert ledger.explain("job-1")["last_answer"] == progress
    assert [(request["last_error"], request["stop_progress"])
            for request in ledger.inspect()["requests"]] == [(None, progress)]

    def stopped() -> bool:
        dispatcher.run_once()
        return state(ledger, "job-1") == RequestState.CANCELLED

    wait_for(stopped, "the stop to be confirmed")
    assert ledger.check_invariants() == []
    dispatcher.release()


def test_a_failed_commands_reason_ends_with_its_last_output_line_masked(
    ledger: Quotagate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``command exited with status 4`` named no cause; now the reason ends with the last
    line of the command's output that says something, the values of the environment it was
    handed and the ledger's URL masked, a URL's password and query values removed
    (docs/decisions/825). A command that prints nothing keeps the bare reason."""
    monkeypatch.setenv("API_TOKEN", "s3cr3t-token-value")
    monkeypatch.setenv("QUOTAGATE_DB", "postgresql://ledger:ledgerpass@ledger-db/quotagate")
    script = (
        'echo "loading model"; '
        'echo "error: cannot reach postgresql://app:dbpass@models/x?key=k1 with $API_TOKEN '
        'from postgresql://ledger:ledgerpass@ledger-db/quotagate" >&2; '
        'echo; echo "  ---  "; exit 4'
    )
    TargetStore(ledger.engine, clock=ledger.clock).set(
        "talky", "process",
        {"command": ["sh", "-c", script], "run_dir": str(tmp_path / "runs"),
         "environment": ["API_TOKEN"]},
        default=True,
    )
    ledger.submit("job-1", "team-a", {"gpu": 1})
    ledger.admit()
    dispatcher = Dispatcher(ledger, worker_name="w1", lease_ttl=30)
    settle(dispatcher, ledger, ["job-1"])
    reason = ledger.show("job-1").reason
    assert reason == ("command exited with status 4: error: cannot reach "
                      "postgresql://models/x?key=*** with $API_TOKEN from $QUOTAGATE_DB")
    for secret in ("s3cr3t", "dbpass", "k1", "ledgerpass"):
        assert secret not in (reason or "")
    dispatcher.release()
