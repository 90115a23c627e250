"""Ledger behaviour, the same on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from quotagate import Conflict, InvalidInput, ManualClock, NotFound, Quotagate, RequestState
from quotagate.store import schema
from support.ledger_state import count, snapshot


@pytest.fixture
def ledger(gate: Quotagate) -> Quotagate:
    gate.set_tenant("team-a", {"gpu": 2, "cpu": 16})
    gate.set_tenant("team-b", {"gpu": 4, "cpu": 16})
    gate.set_pool("pool-1", {"gpu": 4, "cpu": 32})
    gate.set_pool("pool-2", {"gpu": 2, "cpu": 8})
    return gate


def test_identical_resubmit_answers_the_original_with_one_row(ledger: Quotagate) -> None:
    first = ledger.submit("job-0", "team-a", {"gpu": 1}, priority=1, payload={"model": "m"})
    again = ledger.submit("job-0", "team-a", {"gpu": 1}, priority=1, payload={"model": "m"})
    assert first.created and not again.created
    assert again.request == first.request
    assert count(ledger, schema.request) == 1


@pytest.mark.parametrize(
    "changed",
    [
        {"tenant": "team-b"},
        {"cost": {"gpu": 2}},
        {"priority": 5},
        {"payload": {"model": "other"}},
    ],
)
def test_resubmit_with_anything_changed_is_a_conflict_and_changes_nothing(
    ledger: Quotagate, changed: dict[str, object]
) -> None:
    original: dict[str, object] = {"tenant": "team-a", "cost": {"gpu": 1}, "priority": 1,
                                   "payload": {"model": "m"}}
    ledger.submit("job-0", **original)  # type: ignore[arg-type]
    before = snapshot(ledger)
    with pytest.raises(Conflict) as error:
        ledger.submit("job-0", **{**original, **changed})  # type: ignore[arg-type]
    assert error.value.code == "request_conflict"
    assert snapshot(ledger) == before


@pytest.mark.parametrize(
    ("arguments", "error_type", "code"),
    [
        ({"tenant": "nobody", "cost": {"gpu": 1}}, NotFound, "unknown_tenant"),
        ({"cost": {"gpu": 0}}, InvalidInput, "invalid_cost"),
        ({"cost": {"gpu": -2}}, InvalidInput, "invalid_cost"),
        ({"cost": {"gpu": 1.5}}, InvalidInput, "invalid_cost"),
        ({"cost": {"tpu": 1}}, InvalidInput, "unknown_resource"),
        ({"cost": {"gpu": 1}, "payload": {"x": "y" * 70_000}}, InvalidInput, "payload_too_large"),
        ({"cost": {"gpu": 1}, "payload": {1, 2}}, InvalidInput, "invalid_payload"),
        ({"cost": {"gpu": 1}, "priority": "high"}, InvalidInput, "invalid_priority"),
        ({"cost": {"gpu": 1}, "target": "missing"}, NotFound, "unknown_target"),
    ],
)
def test_bad_input_gives_a_clear_error_and_writes_nothing(
    ledger: Quotagate, arguments: dict[str, object], error_type: type[Exception], code: str
) -> None:
    before = snapshot(ledger)
    call: dict[str, object] = {"tenant": "team-a", **arguments}
    with pytest.raises(error_type) as error:
        ledger.submit("job-bad", **call)  # type: ignore[arg-type]
    assert getattr(error.value, "code", None) == code
    assert str(error.value)
    assert snapshot(ledger) == before


def test_admission_charges_both_sides_and_writes_the_outbox(ledger: Quotagate) -> None:
    ledger.submit("job-0", "team-a", {"gpu": 1, "cpu": 4})
    [placement] = ledger.admit()
    assert placement.id == "job-0"
    request = ledger.show("job-0")
    assert request.state is RequestState.RESERVED and request.pool == placement.pool
    usage = ledger.usage()
    assert {"tenant": "team-a", "resource": "gpu", "used": 1, "cap": 2,
            "nominal": 2, "cohort": None, "borrowed": 0, "lent": 0} in usage["tenants"]
    assert {"pool": placement.pool, "resource": "cpu", "used": 4,
            "cap": 32 if placement.pool == "pool-1" else 8} in usage["pools"]
    assert count(ledger, schema.outbox) == 1
    assert ledger.check_invariants() == []


def test_rollback_probe_failure_at_the_last_statement_leaves_nothing(ledger: Quotagate) -> None:
    """An outbox row with the same id makes admission's last INSERT fail."""
    ledger.submit("rollback-probe", "team-b", {"gpu": 1}, priority=100)
    with ledger.engine.begin() as connection:
        connection.execute(schema.outbox.insert().values(
            request_id="rollback-probe", tenant="team-b", created=0.0, next_attempt_at=0.0,
        ))
    before = ledger.usage()
    with pytest.raises(IntegrityError):
        ledger.admit()
    assert ledger.show("rollback-probe").state is RequestState.WAITING
    assert ledger.usage() == before
    assert all(row["used"] == 0 for row in before["tenants"] + before["pools"])
    with ledger.engine.begin() as connection:
        connection.execute(schema.outbox.delete().where(
            schema.outbox.c.request_id == "rollback-probe"))
    [placement] = ledger.admit()
    assert placement.id == "rollback-probe"
    assert ledger.show("rollback-probe").state is RequestState.RESERVED
    assert ledger.check_invariants() == []


def test_release_returns_exactly_the_charged_cost_once(ledger: Quotagate) -> None:
    ledger.submit("job-0", "team-a", {"gpu": 2, "cpu": 3})
    ledger.admit()
    first = ledger.complete("job-0")
    second = ledger.complete("job-0")
    assert first.released == {"cpu": 3, "gpu": 2}
    assert second.released == {}
    assert all(row["used"] == 0 for row in ledger.usage()["tenants"])
    with pytest.raises(Conflict):
        ledger.fail("job-0")
    assert ledger.check_invariants() == []


def test_cancelling_a_waiting_request_charges_and_returns_nothing(ledger: Quotagate) -> None:
    ledger.submit("job-0", "team-a", {"gpu": 1})
    result = ledger.cancel("job-0")
    assert result.released == {} and result.request.state is RequestState.CANCELLED
    assert ledger.admit() == []
    with pytest.raises(Conflict):
        ledger.complete("job-0")
    with pytest.raises(NotFound):
        ledger.cancel("never-submitted")


def test_cancelling_a_reserved_request_is_a_stop_that_returns_its_cost_once_confirmed(
    ledger: Quotagate,
) -> None:
    ledger.submit("job-0", "team-a", {"gpu": 2})
    ledger.admit()
    stopping = ledger.cancel("job-0")
    assert stopping.released == {} and stopping.request.state is RequestState.CANCELLING
    charged = {(row["tenant"], row["resource"]): row["used"] for row in ledger.usage()["tenants"]}
    assert charged[("team-a", "gpu")] == 2  # charged until the stop is confirmed
    assert ledger.cancel("job-0").released == {}  # cancelling again changes nothing
    with pytest.raises(Conflict):
        ledger.complete("job-0")  # nor can it be ended any other way
    assert count(ledger, schema.outbox) == 1 and ledger.check_invariants() == []
    # The worker that saw the target confirm the stop releases it.
    confirmed = ledger.ledger.release("job-0", RequestState.CANCELLED, stopped=True)
    assert confirmed.released == {"gpu": 2} and confirmed.request.state is RequestState.CANCELLED
    assert ledger.ledger.release("job-0", RequestState.CANCELLED, stopped=True).released == {}
    assert count(ledger, schema.outbox) == 0
    assert ledger.check_invariants() == []


def test_a_confirmed_stop_keeps_the_cancellers_reason_and_audits_the_targets(
    ledger: Quotagate,
) -> None:
    ledger.submit("job-0", "team-a", {"gpu": 1})
    ledger.admit()
    ledger.release("job-0", RequestState.CANCELLED, reason="wrong dataset", actor="cli")
    confirmed = ledger.ledger.release("job-0", RequestState.CANCELLED, stopped=True,
                                      reason="command exited with signal 15", actor="worker:w")
    # The stop's reason used to replace the canceller's on the request.
    assert confirmed.request.reason == "wrong dataset"
    assert ledger.show("job-0").reason == "wrong dataset"
    entries = {entry["operation"]: entry for entry in ledger.list_audit(tenant="team-a").items
               if entry["target"] == "job-0"}
    assert entries["cancel"]["reason"] == "wrong dataset"
    assert entries["cancelled"]["reason"] == "command exited with signal 15"
    assert entries["cancelled"]["outcome"] == "released"


def test_expiry_after_the_ttl(ledger: Quotagate, clock: ManualClock) -> None:
    ledger.submit("old", "team-a", {"gpu": 1})
    clock.advance(3000)
    ledger.submit("young", "team-a", {"gpu": 1})
    clock.advance(601)
    assert ledger.expire() == 1
    assert ledger.show("old").state is RequestState.EXPIRED
    assert ledger.show("young").state is RequestState.WAITING
    clock.advance(3600)
    # Admission expires on its own too, before it looks for work.
    assert ledger.admit() == []
    assert ledger.show("young").state is RequestState.EXPIRED


def test_a_big_request_does_not_block_smaller_ones_behind_it(
    ledger: Quotagate, clock: ManualClock
) -> None:
    ledger.set_tenant("team-b", {"gpu": 8})
    ledger.submit("big", "team-b", {"gpu": 4}, priority=10)
    ledger.set_pool("pool-1", {"gpu": 3})  # no pool can hold 4 gpu now
    clock.advance(1)
    ledger.submit("small", "team-b", {"gpu": 1})
    assert [placement.id for placement in ledger.admit(10)] == ["small"]
    explained = ledger.explain("big")
    assert explained["tenant_blocked_by"] == []
    assert explained["fitting_pools"] == [] and "no pool has room" in explained["reason"]


def test_raising_a_quota_makes_waiting_requests_admissible(ledger: Quotagate) -> None:
    ledger.submit("first", "team-a", {"gpu": 2})
    ledger.submit("second", "team-a", {"gpu": 1})
    assert [p.id for p in ledger.admit(5)] == ["first"]
    explained = ledger.explain("second")
    assert explained["tenant_blocked_by"] == [{"resource": "gpu", "need": 1, "used": 2, "cap": 2}]
    assert "tenant quota" in explained["reason"]
    ledger.set_tenant("team-a", {"gpu": 3})
    assert [p.id for p in ledger.admit(5)] == ["second"]


def test_lowering_a_cap_below_use_blocks_new_admissions_until_use_falls(ledger: Quotagate) -> None:
    ledger.submit("a", "team-a", {"gpu": 2})
    ledger.admit()
    ledger.set_tenant("team-a", {"gpu": 1})
    ledger.submit("b", "team-a", {"gpu": 1})
    assert ledger.admit() == []
    ledger.complete("a")
    assert [p.id for p in ledger.admit()] == ["b"]


def test_aging_lets_an_old_low_priority_request_overtake(
    ledger: Quotagate, clock: ManualClock
) -> None:
    ledger.set_tenant("team-a", {"gpu": 1})
    ledger.submit("running", "team-a", {"gpu": 1})
    ledger.admit()
    ledger.submit("old-low", "team-a", {"gpu": 1}, priority=0)
    clock.advance(10)
    ledger.submit("high-1", "team-a", {"gpu": 1}, priority=2)
    # old-low has aged a third of a point: the newer high-priority request is ahead.
    assert ledger.explain("high-1")["position"] == 1
    ledger.complete("running")
    assert [p.id for p in ledger.admit()] == ["high-1"]
    clock.advance(90)
    ledger.submit("high-2", "team-a", {"gpu": 1}, priority=2)
    # 100 s of waiting is 3.33 points, more than high-2's 2: old-low now goes first.
    assert ledger.explain("old-low")["position"] == 1
    ledger.complete("high-1")
    assert [p.id for p in ledger.admit()] == ["old-low"]


def test_best_fit_placement_leaves_big_holes_whole(ledger: Quotagate) -> None:
    ledger.submit("one-gpu", "team-b", {"gpu": 1})
    [placement] = ledger.admit()
    assert placement.pool == "pool-2"  # 2 free beats 4 free
    ledger.submit("three-gpu", "team-b", {"gpu": 3})
    [placement] = ledger.admit()
    assert placement.pool == "pool-1"  # the hole kept whole is still there


def test_a_request_needs_all_of_its_resources_in_one_pool(ledger: Quotagate) -> None:
    # pool-1 has the gpus, pool-2 the cpus; neither has 3 gpu and 10 cpu: refused at submit.
    ledger.set_pool("pool-1", {"gpu": 4, "cpu": 4})
    ledger.set_pool("pool-2", {"gpu": 2, "cpu": 32})
    ledger.set_tenant("team-b", {"gpu": 4, "cpu": 32})
    with pytest.raises(InvalidInput) as refused:
        ledger.submit("split", "team-b", {"gpu": 3, "cpu": 10})
    assert refused.value.code == "cost_above_capacity"
    # Accepted while pool-1 held both, it waits once pool-1 lost the cpus.
    ledger.set_pool("pool-1", {"gpu": 4, "cpu": 16})
    ledger.submit("split", "team-b", {"gpu": 3, "cpu": 10})
    ledger.set_pool("pool-1", {"gpu": 4, "cpu": 4})
    assert ledger.admit() == []
    assert ledger.explain("split")["pools_blocked"] == {"pool-1": ["cpu"], "pool-2": ["gpu"]}


def test_explain_names_position_and_blocking_tenant_resource(ledger: Quotagate) -> None:
    ledger.submit("a", "team-a", {"gpu": 2})
    ledger.submit("b", "team-a", {"cpu": 1, "gpu": 1})
    ledger.admit()
    explained = ledger.explain("b")
    assert explained["position"] == 1 and explained["waiting"]
    assert explained["tenant_blocked_by"][0]["resource"] == "gpu"
    assert ledger.explain("a")["waiting"] is False


def test_inspect_joins_requests_with_outbox(ledger: Quotagate) -> None:
    ledger.submit("a", "team-a", {"gpu": 1})
    ledger.submit("b", "team-a", {"gpu": 2})  # 1 of team-a's 2 gpu left after a
    ledger.admit()
    data = ledger.inspect()
    rows = {row["id"]: row for row in data["requests"]}
    assert rows["a"]["outbox"] == "pending" and rows["a"]["state"] == "reserved"
    assert rows["b"]["outbox"] is None and rows["b"]["state"] == "waiting"
    assert {"tenant", "resource", "used", "cap", "nominal", "cohort", "borrowed",
            "lent"} == set(data["tenants"][0])
    assert {"pool", "resource", "used", "cap"} == set(data["pools"][0])


def test_invariant_check_catches_a_charge_without_outbox(ledger: Quotagate) -> None:
    ledger.submit("a", "team-a", {"gpu": 1})
    ledger.admit()
    with ledger.engine.begin() as connection:
        connection.execute(schema.outbox.delete())
    assert any("without an outbox row" in v for v in ledger.check_invariants())
    with ledger.engine.begin() as connection:
        connection.execute(
            schema.tenant_quota.update().where(schema.tenant_quota.c.resource == "gpu")
            .values(used=sa.literal(2))
        )
    assert any("used 2 but reserved requests cost 1" in v for v in ledger.check_invariants())


@pytest.mark.sqlite
def test_sqlite_readers_do_not_wait_for_a_writer(tmp_path: Path) -> None:
    with Quotagate.connect(f"sqlite:///{tmp_path / 'q.db'}") as gate:
        gate.init()
        gate.set_tenant("team-a", {"gpu": 1})
        with gate.engine.connect() as writer, writer.begin():
            writer.execute(schema.tenant_quota.update().values(used=1))
            # A write transaction is open: a reader sees the last committed state.
            assert gate.usage()["tenants"][0]["used"] == 0


@pytest.mark.parametrize("batch", [1, 3, 20])
def test_every_admission_of_a_batch_has_its_outbox_row_and_audit_entry(
    gate: Quotagate, batch: int, tmp_path: Path
) -> None:
    """Small batches and those past statements.RECORDS_AS_VALUES write the same records."""
    gate.set_target("other", "process", {"command": ["true"], "run_dir": str(tmp_path / "other")})
    gate.set_tenant("team-a", {"gpu": 64})
    gate.set_pool("pool-1", {"gpu": 64})
    for index in range(batch):
        gate.submit(f"job-{index}", "team-a", {"gpu": 1},
                    target="other" if index % 2 else None)
    admitted = gate.admit(batch)
    assert len(admitted) == batch
    with gate.engine.connect() as connection:
        outbox = {row.request_id: (row.tenant, row.target) for row in connection.execute(
            sa.select(schema.outbox.c.request_id, schema.outbox.c.tenant, schema.outbox.c.target))}
        audit = {row.target: (row.tenant, row.reason) for row in connection.execute(
            sa.select(schema.audit.c.target, schema.audit.c.tenant, schema.audit.c.reason)
            .where(schema.audit.c.operation == "admit", schema.audit.c.outcome == "reserved"))}
    assert outbox == {f"job-{index}": ("team-a", "other" if index % 2 else None)
                      for index in range(batch)}
    assert audit == {f"job-{index}": ("team-a", "pool=pool-1") for index in range(batch)}
    assert gate.check_invariants() == []
