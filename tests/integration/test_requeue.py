"""``--on-preempt requeue`` and the room held for the preemptor, on every backend.

A requeued victim's cost comes back once, it waits again with its submission
time, and its next delivery is a new attempt: an object under a name of its
own and fencing tokens above every earlier one — through the process, webhook
and kubernetes targets. The room its stop frees goes to its preemptor, not to
another tenant's waiting request; and a requeued victim never preempts back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quotagate import ManualClock, Quotagate
from quotagate.delivery.dispatcher import Dispatcher
from quotagate.delivery.registry import TargetStore
from quotagate.domain.model import RequestState
from quotagate.errors import InvalidInput
from quotagate.store import schema
from support.holds import contested_hold
from support.waiting import wait_for


def _state(gate: Quotagate, request_id: str) -> str:
    return gate.show(request_id).state.value


def _confirm(gate: Quotagate, request_id: str) -> dict[str, int]:
    """The worker's confirmed stop (quotagate.delivery.dispatcher._stopped)."""
    return gate.ledger.release(request_id, RequestState.CANCELLED, stopped=True).released


def _audit(gate: Quotagate, request_id: str) -> list[tuple[str, str, str | None]]:
    with gate.engine.connect() as connection:
        return [(row.operation, row.outcome, row.reason) for row in connection.execute(
            sa.select(schema.audit).where(schema.audit.c.target == request_id)
            .order_by(schema.audit.c.id))]


def _queue_key(gate: Quotagate, request_id: str) -> float:
    with gate.engine.connect() as connection:
        return float(connection.execute(sa.select(schema.request.c.queue_key)
                                        .where(schema.request.c.id == request_id)).scalar_one())


def _binding(gate: Quotagate, request_id: str) -> dict[str, Any]:
    binding = gate.binding(request_id)
    assert binding is not None
    return dict(binding)


def _within_tenant(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 2})
    gate.set_tenant("team-a", {"gpu": 2}, within_tenant="lower-priority", on_preempt="requeue")


def test_a_requeued_victim_waits_again_with_its_submission_time_and_its_cost_back_once(
    gate: Quotagate, clock: ManualClock
) -> None:
    _within_tenant(gate)
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    submitted, key = gate.show("low").created, _queue_key(gate, "low")
    clock.advance(100)
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    assert gate.admit() == [] and _state(gate, "low") == "preempting"
    assert _confirm(gate, "low") == {"gpu": 2}
    victim = gate.show("low")
    assert (victim.state, victim.attempt, victim.pool) == (RequestState.WAITING, 2, None)
    assert victim.created == submitted and _queue_key(gate, "low") == key  # aging kept
    assert victim.reason == "requeued after preemption by high"
    assert _confirm(gate, "low") == {}  # confirmed again: nothing more comes back
    assert _state(gate, "low") == "waiting"
    assert ("requeue", "waiting", "attempt 2 after preemption by high") in _audit(gate, "low")
    assert ("preempt", "stopping", "within-tenant for high") in _audit(gate, "low")
    assert ("hold", "held", "within-tenant: room of low") in _audit(gate, "high")
    assert [placement.id for placement in gate.admit()] == ["high"]
    assert gate.check_invariants() == []
    gate.complete("high")
    assert [placement.id for placement in gate.admit()] == ["low"]
    assert gate.show("low").attempt == 2 and gate.check_invariants() == []


def test_fail_stays_the_default_and_a_bad_policy_is_refused(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 2})
    gate.set_tenant("team-a", {"gpu": 2}, within_tenant="lower-priority")
    assert gate.tenant("team-a")["on_preempt"] == "fail"
    with pytest.raises(InvalidInput) as refused:
        gate.set_tenant("team-a", {"gpu": 2}, on_preempt="sometimes")
    assert refused.value.code == "invalid_on_preempt"
    assert gate.tenant("team-a")["on_preempt"] == "fail"  # changed nothing
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    gate.admit()
    assert _confirm(gate, "low") == {"gpu": 2} and _state(gate, "low") == "preempted"


def test_a_requeued_request_waits_its_ttl_again_from_its_requeue(
    gate: Quotagate, clock: ManualClock
) -> None:
    _within_tenant(gate)
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    clock.advance(gate.ledger.ttl + 10)  # older than the TTL when it is requeued
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    gate.admit()
    _confirm(gate, "low")
    assert gate.ledger.expire() == 0 and _state(gate, "low") == "waiting"
    clock.advance(gate.ledger.ttl + 1)
    gate.ledger.expire()  # the preemptor, still waiting, expires too
    assert _state(gate, "low") == "expired"


def test_metrics_count_requeues_and_held_preemptors(gate: Quotagate) -> None:
    from quotagate.store.gauges import read_gauges

    _within_tenant(gate)
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    gate.admit()
    assert read_gauges(gate.engine).held == {"team-a": 1}
    _confirm(gate, "low")
    gauges = read_gauges(gate.engine)
    assert gauges.requeued == {"team-a": 1} and gauges.held == {"team-a": 1}
    gate.admit()  # the preemptor: its hold is done
    assert read_gauges(gate.engine).held == {}
    exposition = gate.metrics.exposition().decode()
    assert 'quotagate_requeued_requests_total{tenant="team-a"} 1.0' in exposition


# -- the held room ------------------------------------------------------------------


def test_the_freed_room_goes_to_the_preemptor_not_to_another_tenant(gate: Quotagate) -> None:
    contested_hold(gate)
    assert [placement.id for placement in gate.admit(limit=8)] == ["high"]
    assert _state(gate, "c-wait") == "waiting"
    gate.complete("c-run")  # room that was never held: anyone's
    assert [placement.id for placement in gate.admit(limit=8)] == ["c-wait"]
    assert gate.check_invariants() == []


def test_the_dry_run_and_explain_say_the_room_is_held(gate: Quotagate) -> None:
    contested_hold(gate)
    answer = gate.simulate("team-c", {"gpu": 2})
    assert answer["admissible"] is False
    assert answer["reasons"] == [{"code": "held_for_preemptor", "resource": "room",
                                  "needed": 1, "available": 0}]
    explained = gate.explain("c-wait")
    assert explained["admissible"] is False
    assert explained["reason"].startswith("held_for_preemptor: fits, but only in room")
    assert gate.explain("high")["admissible"] is True


def test_an_expired_hold_holds_nothing(gate: Quotagate, clock: ManualClock) -> None:
    contested_hold(gate)
    clock.advance(gate.ledger.hold_seconds + 1)
    assert [placement.id for placement in gate.admit(limit=8)] == ["c-wait"]
    assert _state(gate, "high") == "waiting"


def test_a_hold_leaves_room_the_preemptor_does_not_need_to_others(gate: Quotagate) -> None:
    contested_hold(gate)
    gate.set_pool("pool-1", {"gpu": 8})  # two more units nobody's preemption freed
    admitted = sorted(placement.id for placement in gate.admit(limit=8))
    assert admitted == ["c-wait", "high"]


def test_admitters_racing_for_the_freed_room_leave_it_to_the_preemptor(db_url: str) -> None:
    """Four processes admit at once after the victim's stop: the room goes to high."""
    from support import cohort_workers
    from support.racing import race

    with Quotagate.connect(db_url) as gate:
        gate.set_pool("pool-1", {"gpu": 6})
        gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority",
                        on_preempt="requeue")
        gate.set_tenant("team-c", {"gpu": 4}, weight=10)
        for name, tenant, priority in (("a-keep", "team-a", 9), ("low", "team-a", 0),
                                       ("c-run", "team-c", 0)):
            gate.submit(name, tenant, {"gpu": 2}, priority=priority)
        gate.admit_until_idle()
        for index in range(4):
            gate.submit(f"c-wait-{index}", "team-c", {"gpu": 1})
        gate.submit("high", "team-a", {"gpu": 2}, priority=5)
        assert gate.admit() == [] and _state(gate, "low") == "preempting"
        assert _confirm(gate, "low") == {"gpu": 2}
    admitted = race(cohort_workers.admit_once, db_url, processes=4)
    assert sorted(name for names in admitted for name in names) == ["high"]
    with Quotagate.connect(db_url) as gate:
        assert all(_state(gate, f"c-wait-{index}") == "waiting" for index in range(4))
        assert gate.check_invariants() == []


# -- no preemption loops ----------------------------------------------------------------


def test_a_requeued_victim_does_not_preempt_its_preemptor_back(gate: Quotagate) -> None:
    """b-gpu is reclaimed for a-gpu; later team-a borrows cpu, and b-gpu, back in the
    queue within team-b's nominal, could reclaim — but never a-gpu, its preemptor."""
    gate.set_pool("pool-1", {"gpu": 1, "cpu": 8})
    gate.set_cohort("org")
    for tenant in ("team-a", "team-b"):
        gate.set_tenant(tenant, {"gpu": 1, "cpu": 2}, cohort="org", reclaim="any",
                        on_preempt="requeue")
    gate.submit("b-cpu", "team-b", {"cpu": 3}, priority=1)  # team-b borrows cpu
    gate.submit("b-gpu", "team-b", {"gpu": 1}, priority=0)
    gate.admit_until_idle()
    gate.submit("a-gpu", "team-a", {"gpu": 1}, priority=0)
    assert gate.admit() == [] and _state(gate, "b-gpu") == "preempting"
    assert _state(gate, "b-cpu") == "reserved"
    _confirm(gate, "b-gpu")
    assert [placement.id for placement in gate.admit()] == ["a-gpu"]
    gate.complete("b-cpu")
    gate.submit("a-cpu", "team-a", {"cpu": 3}, priority=5)  # now team-a borrows
    assert [placement.id for placement in gate.admit()] == ["a-cpu"]
    for _ in range(3):
        assert gate.admit() == []
    assert _state(gate, "a-gpu") == "reserved" and _state(gate, "a-cpu") == "reserved"
    assert _state(gate, "b-gpu") == "waiting"
    assert gate.simulate("team-b", {"gpu": 1})["would_preempt"] != []  # a newcomer would
    assert gate.check_invariants() == []


# -- new attempts through the real targets ---------------------------------------------


TargetSetup = Callable[[Quotagate], "Observed"]


class Observed:
    """What a target shows of the requests' objects (the external side)."""

    def __init__(self, objects: Callable[[], dict[str, dict[str, Any]]],
                 confirm: Callable[[str], None] = lambda _name: None,
                 run_dir: Path | None = None) -> None:
        self.objects = objects  # name -> {"attempt", "token", "stopped"}
        self.confirm = confirm  # what an executor does to confirm a stop, if anything
        self.run_dir = run_dir  # the process target's run directories


@pytest.fixture(params=["process", "webhook", "kubernetes"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TargetSetup]:
    with ExitStack() as stack:
        if request.param == "process":
            runs = tmp_path / "runs"

            def process(gate: Quotagate) -> Observed:
                gate.set_target("local", "process", {"command": ["sh", "-c", "sleep 60"],
                                                     "run_dir": str(runs)}, default=True)

                def objects() -> dict[str, dict[str, Any]]:
                    found = {}
                    for run in runs.iterdir() if runs.exists() else []:
                        if run.name.startswith(".") or not (run / "request.json").exists():
                            continue
                        spec = json.loads((run / "request.json").read_text())
                        found[run.name] = {"attempt": spec["attempt"],
                                           "token": spec["fencing_token"],
                                           "stopped": (run / "exit_status").exists()}
                    return found

                return Observed(objects, run_dir=runs)

            yield process
        elif request.param == "webhook":
            from support.receiver import running_receiver

            receiver = stack.enter_context(running_receiver())

            def webhook(gate: Quotagate) -> Observed:
                TargetStore(gate.engine).set("hooks", "webhook", {"url": receiver.url},
                                             default=True)

                def objects() -> dict[str, dict[str, Any]]:
                    posts = {call["body"]["name"]: call for call in receiver.calls_of("POST")}
                    return {name: {"attempt": call["body"]["attempt"],
                                   "token": call["body"]["fencing_token"],
                                   "key": call["headers"]["Idempotency-Key"],
                                   "stopped": receiver.objects[name]["state"] == "stopped"}
                            for name, call in posts.items()}

                return Observed(objects)

            yield webhook
        else:
            from support.kube_api import running_api_server

            kube_api = stack.enter_context(running_api_server())

            def kubernetes(gate: Quotagate) -> Observed:
                # Suspend, not delete: the stopped attempt's object stays, next to the new one.
                TargetStore(gate.engine).set("cluster", "kubernetes",
                                             {"host": kube_api.host, "timeout": 2.0,
                                              "stop": "suspend"}, default=True)

                def objects() -> dict[str, dict[str, Any]]:
                    found = {}
                    for stored in kube_api.model_services():
                        metadata = stored["metadata"]
                        annotations = metadata["annotations"]
                        found[metadata["name"]] = {
                            "attempt": int(annotations["quotagate.io/attempt"]),
                            "token": int(annotations["quotagate.io/fencing-token"]),
                            "stopped": bool(stored.get("spec", {}).get("suspend"))}
                    return found

                def confirm(name: str) -> None:  # the controller suspends the work
                    if kube_api.get(name).get("spec", {}).get("suspend"):
                        kube_api.set_status(name, phase="Suspended")

                return Observed(objects, confirm)

            yield kubernetes


def test_a_requeued_victim_is_delivered_again_as_a_new_attempt(
    gate: Quotagate, clock: ManualClock, target: TargetSetup
) -> None:
    observed = target(gate)
    _within_tenant(gate)
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    gate.admit()
    dispatcher = Dispatcher(gate, worker_name="w1", stop_poll=0.05)
    try:
        dispatcher.run_once()
        first = _binding(gate, "low")
        assert _state(gate, "low") == "delivered"
        gate.submit("high", "team-a", {"gpu": 2}, priority=5)
        assert gate.admit() == [] and _state(gate, "low") == "preempting"

        drive(dispatcher, observed, lambda: _state(gate, "low") == "waiting",
              "the victim's confirmed stop and requeue")
        assert gate.binding("low") is None  # the stopped object is no longer its binding
        assert [placement.id for placement in gate.admit()] == ["high"]
        drive(dispatcher, observed, lambda: _state(gate, "high") == "delivered",
              "the preemptor delivered")
        gate.cancel("high")
        drive(dispatcher, observed, lambda: _state(gate, "high") == "cancelled",
              "the preemptor stopped")
        assert [placement.id for placement in gate.admit()] == ["low"]
        wait_for(lambda: dispatcher.run_once() is not None
                 and _state(gate, "low") == "delivered", "the second attempt delivered")
        second = _binding(gate, "low")
        assert second["external_name"] != first["external_name"]
        assert "-a2-" in second["external_name"]
        objects = observed.objects()
        old, new = objects[first["external_name"]], objects[second["external_name"]]
        assert (old["attempt"], new["attempt"]) == (1, 2)
        assert old["stopped"] and not new["stopped"]
        # Strictly above every token of the first attempt, its stop's included.
        assert second["fencing_token"] > first["fencing_token"] + 1
        assert new["token"] == second["fencing_token"]
        if "key" in new:
            assert (old["key"], new["key"]) == ("low", "low#2")
        assert gate.check_invariants() == []
        gate.cancel("low")
        drive(dispatcher, observed, lambda: _state(gate, "low") == "cancelled",
              "the second attempt stopped")
        if observed.run_dir is not None:
            # Pruning removes every attempt's run directory, not only the bound one.
            clock.advance(10)
            assert gate.prune(1).external_objects == 3  # low twice, high once
            assert [path for path in observed.run_dir.iterdir()
                    if not path.name.startswith(".")] == []
    finally:
        dispatcher.release()


def drive(dispatcher: Dispatcher, observed: Observed, done: Callable[[], bool],
          what: str) -> None:
    """Worker passes, the executor confirming stops, until ``done``."""
    def step() -> bool:
        dispatcher.run_once()
        for name in observed.objects():
            observed.confirm(name)
        return done()

    wait_for(step, what)


# -- a worker killed between the confirmed stop and the requeue ----------------------


def test_a_worker_killed_after_confirming_the_stop_is_replaced_and_requeues_once(
    db_url: str, tmp_path: Path
) -> None:
    """Real `quotagate worker` processes and a real SIGKILL (crash point ``after_stop``):
    the victim's process is stopped, the worker dies before the ledger hears of it; the
    next worker stops it again (idempotent), and the victim is requeued exactly once."""
    import signal

    from support.worker_processes import finish, start_worker, stop_all, table

    runs = tmp_path / "runs"
    with Quotagate.connect(db_url) as gate:
        gate.set_target("local", "process", {"command": ["sh", "-c", "sleep 60"],
                                             "run_dir": str(runs)}, default=True)
        _within_tenant(gate)
        gate.submit("low", "team-a", {"gpu": 2}, priority=0)
        gate.admit()
        first = start_worker(db_url, "w1", crash_at="after_stop")
        workers = [first]
        try:
            wait_for(lambda: _state(gate, "low") == "delivered", "the victim delivered",
                     timeout=60)
            [run] = [path for path in runs.iterdir() if not path.name.startswith(".")]
            wait_for(lambda: (run / "pid").exists() and (run / "pid").read_text(),
                     "the victim to run", timeout=60)
            gate.submit("high", "team-a", {"gpu": 2}, priority=5)
            assert gate.admit() == [] and _state(gate, "low") == "preempting"
            assert finish(first) == -signal.SIGKILL
            assert (run / "exit_status").exists()  # stopped, but the ledger does not know
            assert _state(gate, "low") == "preempting" and gate.show("low").attempt == 1
            second = start_worker(db_url, "w2")
            workers.append(second)
            wait_for(lambda: _state(gate, "low") == "waiting", "the victim requeued",
                     timeout=60)
            assert gate.show("low").attempt == 2
            releases = [row for row in table(gate, schema.audit)
                        if row["target"] == "low" and row["outcome"] == "released"]
            requeues = [row for row in table(gate, schema.audit)
                        if row["target"] == "low" and row["operation"] == "requeue"]
            assert len(releases) == 1 and len(requeues) == 1  # its cost came back once
            assert [placement.id for placement in gate.admit()] == ["high"]
            assert gate.check_invariants() == []
            gate.cancel("high")
            wait_for(lambda: _state(gate, "high") == "cancelled", "the preemptor stopped",
                     timeout=60)
            assert [placement.id for placement in gate.admit()] == ["low"]
            wait_for(lambda: _state(gate, "low") == "delivered", "the second attempt",
                     timeout=60)
            binding = gate.binding("low")
            assert binding is not None and binding["external_name"] != run.name
            gate.cancel("low")
            wait_for(lambda: _state(gate, "low") == "cancelled", "the second attempt stopped",
                     timeout=60)
            assert gate.check_invariants() == []
        finally:
            stop_all(workers)
