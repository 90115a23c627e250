"""Batched fenced release (Ledger.release_many, docs/decisions/218), on every backend.

A request's cost comes back exactly once, however many processes end it at
the same time and however their batches overlap; a refused end in a batch
writes nothing and does not stop the others; a stale fence writes nothing.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from quotagate import Quotagate, RequestState
from quotagate.delivery.registry import TargetStore
from quotagate.domain.external_object import ExternalObject
from quotagate.errors import Conflict, Forbidden, NotFound, StaleGeneration
from quotagate.store import schema
from quotagate.store.authority import (
    NotDeliveredYet,
    StaleFencingToken,
    executor_guard,
    tenant_guard,
)
from quotagate.store.group_release import GroupRelease
from quotagate.store.outbox import OutboxStore
from quotagate.store.release import End
from support import workers

ENDERS = 4
REQUESTS = 60


def _setup(gate: Quotagate, count: int) -> dict[str, dict[str, int]]:
    gate.set_tenant("team-a", {"gpu": 1000, "cpu": 1000})
    gate.set_tenant("team-b", {"gpu": 1000, "cpu": 1000})
    gate.set_pool("pool-1", {"gpu": 40, "cpu": 500})
    gate.set_pool("pool-2", {"gpu": 1000, "cpu": 1000})
    costs = {}
    for index in range(count):
        cost = {"gpu": 1 + index % 3, "cpu": 1 + index % 5}
        request_id = f"r-{index:03d}"
        gate.submit(request_id, "team-a" if index % 2 else "team-b", cost)
        costs[request_id] = cost
    assert gate.admit_until_idle(batch=16) == count
    return costs


def _recount(gate: Quotagate) -> None:
    """Usage equals the sum of the costs of the requests still charged, straight from the rows."""
    charged = ("reserved", "delivered", "cancelling")
    with gate.engine.connect() as connection:
        rows = connection.execute(
            sa.select(schema.request.c.tenant, schema.request.c.pool, schema.request.c.cost)
            .where(schema.request.c.state.in_(charged))
        ).all()
    tenant_sum: Counter[tuple[str, str]] = Counter()
    pool_sum: Counter[tuple[str, str]] = Counter()
    for tenant, pool, cost in rows:
        for resource, amount in json.loads(cost).items():
            tenant_sum[tenant, resource] += amount
            pool_sum[pool, resource] += amount
    usage = gate.usage()
    for row in usage["tenants"]:
        assert row["used"] == tenant_sum[row["tenant"], row["resource"]], row
    for row in usage["pools"]:
        assert row["used"] == pool_sum[row["pool"], row["resource"]], row
    assert gate.check_invariants() == []


def test_processes_ending_the_same_requests_get_each_cost_back_once(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        costs = _setup(gate, REQUESTS)
    # Two thirds are ended, by every process at once; the rest stay charged.
    ended = sorted(costs)[: REQUESTS * 2 // 3]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(ENDERS)
    results: multiprocessing.Queue[tuple[list[str], dict[str, int]]] = context.Queue()
    processes = [
        context.Process(target=workers.end_in_batches, args=(
            db_url, ended, "completed" if index % 2 else "failed", index, 7 + index * 5,
            barrier, results))
        for index in range(ENDERS)
    ]
    for process in processes:
        process.start()
    answers = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    released = [request_id for ids, _returned in answers for request_id in ids]
    assert sorted(released) == ended  # each ended request released by exactly one process
    returned: Counter[str] = Counter()
    for _ids, amounts in answers:
        returned.update(amounts)
    expected: Counter[str] = Counter()
    for request_id in ended:
        expected.update(costs[request_id])
    assert returned == expected
    with Quotagate.connect(db_url) as gate:
        states = {request_id: gate.show(request_id).state for request_id in costs}
        assert all(states[request_id] in (RequestState.COMPLETED, RequestState.FAILED)
                   for request_id in ended)
        assert all(states[request_id] == RequestState.RESERVED
                   for request_id in costs if request_id not in ended)
        with gate.engine.connect() as connection:
            released_entries = connection.execute(
                sa.select(schema.audit.c.target, sa.func.count())
                .where(schema.audit.c.outcome == "released").group_by(schema.audit.c.target)
            ).all()
            outbox_left = connection.execute(sa.select(sa.func.count()).select_from(
                schema.outbox)).scalar_one()
        assert dict(released_entries) == dict.fromkeys(ended, 1)
        assert outbox_left == REQUESTS - len(ended)
        _recount(gate)


def test_a_refused_end_writes_nothing_and_the_batch_goes_on(gate: Quotagate) -> None:
    _setup(gate, 4)
    gate.submit("waiting-1", "team-a", {"gpu": 1})  # no admission runs after it: waiting
    before = gate.usage()
    results = gate.ledger.release_many([
        End("r-000", RequestState.COMPLETED, actor="test"),
        End("missing", RequestState.COMPLETED),
        End("r-001", RequestState.COMPLETED, tenant="team-b"),  # team-a's: not found
        End("r-002", RequestState.FAILED, guard=tenant_guard),  # a tenant may not end it
        End("r-000", RequestState.FAILED),  # ended earlier in this batch
        End("r-000", RequestState.COMPLETED),  # the same end again: a no-op
        End("waiting-1", RequestState.CANCELLED),
        End("r-003", RequestState.CANCELLED),  # a stop: cancelling, still charged
    ])
    first, missing, other_tenant, forbidden, again, replay, waiting, stop = results
    assert not isinstance(first, Exception) and first.released == {"gpu": 1, "cpu": 1}
    assert isinstance(missing, NotFound)
    assert isinstance(other_tenant, NotFound)
    assert isinstance(forbidden, Forbidden)
    assert isinstance(again, Conflict)
    assert not isinstance(replay, Exception) and replay.released == {}
    assert not isinstance(waiting, Exception)
    assert waiting.request.state == RequestState.CANCELLED and waiting.released == {}
    assert not isinstance(stop, Exception)
    assert stop.request.state == RequestState.CANCELLING and stop.released == {}
    assert gate.show("r-001").state == RequestState.RESERVED
    assert gate.show("r-002").state == RequestState.RESERVED
    assert gate.show("r-003").state == RequestState.CANCELLING
    after = {(row["tenant"], row["resource"]): row["used"] for row in gate.usage()["tenants"]}
    for row in before["tenants"]:
        expected = row["used"] - (1 if (row["tenant"], row["resource"]) in (
            ("team-b", "gpu"), ("team-b", "cpu")) else 0)
        assert after[row["tenant"], row["resource"]] == expected
    _recount(gate)


def test_a_stale_fence_writes_nothing(gate: Quotagate) -> None:
    _setup(gate, 3)
    before = gate.usage()

    def stale(_connection: sa.Connection) -> None:
        raise StaleGeneration("lease taken over")

    with pytest.raises(StaleGeneration):
        gate.ledger.release_many(
            [End(f"r-{index:03d}", RequestState.COMPLETED) for index in range(3)], fence=stale)
    assert gate.usage() == before
    assert {gate.show(f"r-{index:03d}").state for index in range(3)} == {RequestState.RESERVED}


def test_group_commit_answers_every_caller_with_its_own_end(gate: Quotagate) -> None:
    costs = _setup(gate, 24)
    group = GroupRelease(gate.ledger.release_many)
    answers: dict[str, object] = {}

    def end(request_id: str) -> None:
        try:
            answers[request_id] = group.release(End(request_id, RequestState.COMPLETED))
        except Exception as error:
            answers[request_id] = error

    threads = [threading.Thread(target=end, args=(request_id,))
               for request_id in [*costs, "missing"]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert isinstance(answers.pop("missing"), NotFound)
    for request_id, answer in answers.items():
        assert not isinstance(answer, Exception)
        assert answer.released == costs[request_id]  # type: ignore[attr-defined]
    _recount(gate)
    assert all(row["used"] == 0 for row in gate.usage()["tenants"])


def test_executor_callbacks_in_one_batch_are_judged_as_each_alone(gate: Quotagate) -> None:
    """A batch reads all its callbacks' facts at once (docs/decisions/247); every end still
    gets the answer its own guard, reading its own facts, gives."""
    _setup(gate, 6)
    TargetStore(gate.engine).set("hook", "webhook", {"url": "http://127.0.0.1:9/"},
                                 default=True)
    outbox = OutboxStore(gate.engine, gate.leases, gate.clock)
    lease = gate.leases.acquire("worker-1", "test", 60.0)
    assert lease is not None
    claims = {claim.request_id: claim for claim in outbox.claim_work(lease, 6, stops=False)}
    assert len(claims) == 6
    bound = ["r-000", "r-001", "r-002"]  # delivered; r-003 and r-004 in flight
    outbox.record_deliveries(lease, [
        (claims[request_id], "hook", ExternalObject(f"obj-{request_id}", None, request_id))
        for request_id in bound], actor="test")

    def token(request_id: str) -> int:
        return claims[request_id].fencing_token

    ends = [
        End("r-000", RequestState.COMPLETED, guard=executor_guard("hook", token("r-000"))),
        End("r-001", RequestState.COMPLETED, guard=executor_guard("hook", token("r-001") - 1)),
        End("r-002", RequestState.COMPLETED, guard=executor_guard("other", token("r-002"))),
        End("r-003", RequestState.FAILED, guard=executor_guard("hook", token("r-003"))),
        End("r-004", RequestState.COMPLETED, guard=executor_guard("hook", token("r-004") + 1)),
        End("r-005", RequestState.COMPLETED, guard=executor_guard("hook", None)),
        # Again, in the batch's next round: its outbox row is gone by then.
        End("r-000", RequestState.COMPLETED, guard=executor_guard("hook", token("r-000"))),
        End("missing", RequestState.COMPLETED, guard=executor_guard("hook", 1)),
    ]
    # What each guard says alone, reading its own facts, before anything ends.
    alone: list[type[Exception] | None] = []
    with gate.engine.begin() as connection:
        for end in ends[:6]:
            row = gate.show(end.request_id)
            try:
                assert end.guard is not None
                end.guard(connection, {"id": row.id, "state": row.state.value}, end.to_state)
                alone.append(None)
            except Exception as error:
                alone.append(type(error))
    assert alone == [None, StaleFencingToken, NotFound, None, NotDeliveredYet,
                     StaleFencingToken]
    results = gate.ledger.release_many(ends)
    assert [None if not isinstance(result, Exception) else type(result)
            for result in results[:6]] == alone
    first, again, missing = results[0], results[6], results[7]
    assert not isinstance(first, Exception) and first.released
    assert not isinstance(again, Exception) and again.released == {}
    assert isinstance(missing, NotFound)
    assert gate.show("r-003").state == RequestState.FAILED
    assert {gate.show(f"r-00{index}").state for index in (1, 2, 4, 5)} <= {
        RequestState.RESERVED, RequestState.DELIVERED}
    _recount(gate)


def test_an_end_built_on_the_writer_answers_its_caller_alone(gate: Quotagate) -> None:
    """docs/decisions/316: an end handed over unbuilt is built on the writer thread; a build
    that raises is its caller's answer only, and one withdrawn before its group is not written."""
    costs = _setup(gate, 3)
    group = GroupRelease(gate.ledger.release_many)
    started, go = threading.Event(), threading.Event()

    def first() -> End:
        started.set()
        assert go.wait(60)
        return End("r-000", RequestState.COMPLETED)

    def refused() -> End:
        raise Forbidden("no", code="forbidden")

    held = group.release_later(first)
    assert started.wait(60)  # the writer is inside its group: the next ends wait for the next one
    withdrawn = group.release_later(lambda: End("r-001", RequestState.COMPLETED))
    failing = group.release_later(refused)
    kept = group.release_later(lambda: End("r-002", RequestState.COMPLETED))
    assert withdrawn.cancel()
    go.set()
    assert held.result(60).released == costs["r-000"]
    with pytest.raises(Forbidden):
        failing.result(60)
    assert kept.result(60).released == costs["r-002"]
    assert gate.show("r-001").state == RequestState.RESERVED
    _recount(gate)
