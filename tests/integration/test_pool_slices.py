"""Capacity slices of pools (docs/decisions/029-capacity-slices.md), on every backend."""

from __future__ import annotations

import json
import multiprocessing
from collections import defaultdict
from functools import partial

import pytest
import sqlalchemy as sa

from quotagate import Conflict, InvalidInput, Quotagate, RequestState
from quotagate.store import pool_slices, schema
from quotagate.store.dialect import run_transaction
from quotagate.store.migrate import upgrade
from support import lock_order_workers, workers
from support.ledger_state import count, snapshot
from support.racing import race_mixed

capacity = schema.pool_capacity


def _slices(gate: Quotagate, pool: str) -> dict[tuple[int, str], tuple[int, int]]:
    """``{(slice, resource): (used, cap)}`` of one pool, straight from the rows."""
    with gate.engine.connect() as connection:
        rows = connection.execute(
            sa.select(capacity.c.slice, capacity.c.resource, capacity.c.used, capacity.c.cap)
            .where(capacity.c.pool == pool)).all()
    return {(int(number), resource): (int(used), int(cap)) for number, resource, used, cap in rows}


def _slice_of(gate: Quotagate, request_id: str) -> int | None:
    with gate.engine.connect() as connection:
        found = connection.execute(sa.select(schema.request.c.pool_slice)
                                   .where(schema.request.c.id == request_id)).scalar()
    return None if found is None else int(found)


def test_a_pool_has_one_slice_unless_told_and_admission_records_none(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 8})
    gate.set_pool("pool-1", {"gpu": 4, "cpu": 8})
    assert _slices(gate, "pool-1") == {(0, "cpu"): (0, 8), (0, "gpu"): (0, 4)}
    assert gate.pool("pool-1")["slices"] == 1
    gate.submit("job-0", "team-a", {"gpu": 3})
    assert [placement.id for placement in gate.admit()] == ["job-0"]
    assert _slice_of(gate, "job-0") is None
    assert _slices(gate, "pool-1")[0, "gpu"] == (3, 4)


def test_slices_split_every_cap_and_every_view_shows_the_sums(gate: Quotagate) -> None:
    gate.set_pool("pool-1", {"gpu": 10, "cpu": 7}, slices=4)
    rows = _slices(gate, "pool-1")
    assert [rows[number, "gpu"][1] for number in range(4)] == [3, 3, 2, 2]
    assert [rows[number, "cpu"][1] for number in range(4)] == [2, 2, 2, 1]
    described = gate.pool("pool-1")
    assert described["slices"] == 4
    assert described["capacity"] == {"cpu": {"used": 0, "cap": 7}, "gpu": {"used": 0, "cap": 10}}
    assert {(row["resource"], row["cap"]) for row in gate.usage()["pools"]} == {
        ("cpu", 7), ("gpu", 10)}
    # A new cap is spread over the slices too.
    gate.set_pool("pool-1", {"gpu": 5})
    assert sum(cap for (_number, resource), (_used, cap) in _slices(gate, "pool-1").items()
               if resource == "gpu") == 5


def test_release_returns_the_cost_to_the_slice_it_was_charged_to(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 8, "cpu": 8})
    gate.set_pool("pool-1", {"gpu": 8, "cpu": 8}, slices=4)
    for index in range(4):
        gate.submit(f"job-{index}", "team-a", {"gpu": 1, "cpu": 2})
    assert len(gate.admit(1)) == 1
    assert len(gate.admit(1)) == 1
    slices = {_slice_of(gate, "job-0"), _slice_of(gate, "job-1")}
    # Each admission took the slice with the most room: two different slices.
    assert len(slices) == 2 and None not in slices
    first = _slice_of(gate, "job-0")
    assert first is not None
    assert _slices(gate, "pool-1")[first, "gpu"] == (1, 2)
    gate.release("job-0", RequestState.COMPLETED)
    rows = _slices(gate, "pool-1")
    assert rows[first, "gpu"] == (0, 2) and rows[first, "cpu"] == (0, 2)
    assert sum(used for used, _cap in rows.values()) == 3  # job-1's gpu 1 + cpu 2
    assert gate.check_invariants() == []


def test_a_request_that_fits_the_pool_but_no_slice_is_admitted_after_a_rebalance(
    gate: Quotagate,
) -> None:
    gate.set_tenant("team-a", {"gpu": 16})
    gate.set_pool("pool-1", {"gpu": 8}, slices=4)
    # Four small ones, best fit: packed into two slices, the other two keep 2 each.
    for index in range(4):
        gate.submit(f"small-{index}", "team-a", {"gpu": 1})
        assert len(gate.admit(1)) == 1
    assert sorted(used for used, _cap in _slices(gate, "pool-1").values()) == [0, 0, 2, 2]
    gate.submit("big", "team-a", {"gpu": 4})
    assert [placement.id for placement in gate.admit(1)] == ["big"]
    rows = _slices(gate, "pool-1")
    assert sum(cap for _used, cap in rows.values()) == 8
    assert all(used <= cap for used, cap in rows.values())
    assert gate.check_invariants() == []
    # What the pool has not got stays refused, and the refusal moves nothing.
    gate.submit("too-big", "team-a", {"gpu": 1})
    before = _slices(gate, "pool-1")
    assert gate.admit(1) == []
    assert _slices(gate, "pool-1") == before


def test_check_finds_use_moved_between_slices_that_the_sums_hide(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 8})
    gate.set_pool("pool-1", {"gpu": 8}, slices=2)
    gate.submit("job-0", "team-a", {"gpu": 2})
    gate.admit()
    charged = _slice_of(gate, "job-0")
    assert charged is not None
    assert gate.check_invariants() == []
    with gate.engine.begin() as connection:
        for number, change in ((charged, -1), (1 - charged, 1)):
            connection.execute(capacity.update()
                               .where(capacity.c.pool == "pool-1", capacity.c.slice == number)
                               .values(used=capacity.c.used + change))
    problems = gate.check_invariants()
    assert any(f"pool pool-1 slice {charged} gpu: used 1" in problem for problem in problems)
    assert not any("pool pool-1 gpu" in problem for problem in problems)  # the sum is right


def test_more_slices_while_in_use_and_fewer_only_once_the_slices_going_are_empty(
    gate: Quotagate,
) -> None:
    gate.set_tenant("team-a", {"gpu": 8})
    gate.set_pool("pool-1", {"gpu": 8})
    gate.submit("old", "team-a", {"gpu": 2})
    gate.admit()
    gate.set_pool("pool-1", {}, slices=4)
    rows = _slices(gate, "pool-1")
    assert rows[0, "gpu"][0] == 2 and sum(cap for _used, cap in rows.values()) == 8
    for index in range(3):
        gate.submit(f"new-{index}", "team-a", {"gpu": 1})
        gate.admit(1)
    assert gate.check_invariants() == []
    busy = {_slice_of(gate, f"new-{index}") for index in range(3)} - {0, None}
    assert busy  # some went to the new slices
    before = snapshot(gate)
    with pytest.raises(Conflict) as refused:
        gate.set_pool("pool-1", {}, slices=1)
    assert refused.value.code == "slice_in_use"
    assert snapshot(gate) == before
    gate.release("old", RequestState.COMPLETED)  # charged before slices: back to slice 0
    for index in range(3):
        gate.release(f"new-{index}", RequestState.COMPLETED)
    gate.set_pool("pool-1", {}, slices=1)
    assert _slices(gate, "pool-1") == {(0, "gpu"): (0, 8)}
    assert gate.check_invariants() == []


def test_a_requeued_victim_forgets_its_slice_and_is_charged_and_returned_where_it_runs_next(
    gate: Quotagate,
) -> None:
    gate.set_tenant("team-a", {"gpu": 4}, within_tenant="lower-priority", on_preempt="requeue")
    gate.set_pool("pool-1", {"gpu": 4}, slices=2)
    gate.submit("filler", "team-a", {"gpu": 2}, priority=3)
    gate.submit("low", "team-a", {"gpu": 2}, priority=0)
    assert len(gate.admit(1)) == 1 and len(gate.admit(1)) == 1  # a batch claims one slice
    assert {_slice_of(gate, "filler"), _slice_of(gate, "low")} == {0, 1}
    gate.submit("high", "team-a", {"gpu": 2}, priority=5)
    assert gate.admit() == [] and gate.show("low").state == RequestState.PREEMPTING
    gate.ledger.release("low", RequestState.CANCELLED, stopped=True)  # the confirmed stop
    victim = gate.show("low")
    assert (victim.state, victim.pool, _slice_of(gate, "low")) == (RequestState.WAITING, None,
                                                                   None)
    assert [placement.id for placement in gate.admit()] == ["high"]
    gate.release("high", RequestState.COMPLETED)
    gate.release("filler", RequestState.COMPLETED)
    # One slice again: the victim runs next on an unsliced pool, which records no slice.
    gate.set_pool("pool-1", {}, slices=1)
    assert [placement.id for placement in gate.admit()] == ["low"]
    assert _slice_of(gate, "low") is None
    gate.release("low", RequestState.COMPLETED)
    assert _slices(gate, "pool-1") == {(0, "gpu"): (0, 4)}
    assert gate.check_invariants() == []


def test_a_cap_lowered_below_use_leaves_no_slice_room(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 16})
    gate.set_pool("pool-1", {"gpu": 8}, slices=4)
    for index in range(3):
        gate.submit(f"job-{index}", "team-a", {"gpu": 1})
        gate.admit(1)
    gate.set_pool("pool-1", {"gpu": 2})
    rows = _slices(gate, "pool-1")
    assert sum(cap for _used, cap in rows.values()) == 2
    assert all(cap <= used for used, cap in rows.values())
    gate.submit("more", "team-a", {"gpu": 1})
    assert gate.admit(1) == []
    assert gate.check_ledger().violations == []


@pytest.mark.parametrize("slices", [0, 65, True, "4"])
def test_a_bad_slice_count_is_refused_and_changes_nothing(gate: Quotagate, slices: object) -> None:
    gate.set_pool("pool-1", {"gpu": 8})
    before = snapshot(gate)
    with pytest.raises(InvalidInput) as refused:
        gate.set_pool("pool-1", {"gpu": 4}, slices=slices)  # type: ignore[arg-type]
    assert refused.value.code == "invalid_slices"
    assert snapshot(gate) == before


def test_with_sliced_pools_an_admission_serves_the_tenants_no_other_admitter_holds(
    gate: Quotagate, backend: str,
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite has one writer: there is no second admitter to step around")
    gate.set_tenant("team-a", {"gpu": 8})
    gate.set_tenant("team-b", {"gpu": 8})
    gate.set_pool("pool-1", {"gpu": 8}, slices=2)
    gate.submit("a-0", "team-a", {"gpu": 1})
    gate.submit("b-0", "team-b", {"gpu": 1})
    quota = schema.tenant_quota
    # Another transaction holds team-a's quota rows, as an admitter charging it would.
    with gate.engine.connect() as other_admitter, other_admitter.begin():
        other_admitter.execute(sa.select(quota.c.tenant).where(quota.c.tenant == "team-a")
                               .with_for_update()).all()
        placed = gate.admit(4)
        assert [placement.id for placement in placed] == ["b-0"]
    assert [placement.id for placement in gate.admit(4)] == ["a-0"]
    assert gate.check_invariants() == []


def test_slices_for_a_pool_without_capacity_are_refused_and_change_nothing(
    gate: Quotagate,
) -> None:
    before = snapshot(gate)
    with pytest.raises(InvalidInput) as refused:
        gate.set_pool("empty", {}, slices=4)
    assert refused.value.code == "slices_without_capacity"
    assert snapshot(gate) == before


def test_the_migration_makes_every_capacity_row_slice_0_and_keeps_the_charges(
    empty_db_url: str,
) -> None:
    with Quotagate.connect(empty_db_url) as gate:
        upgrade(gate.engine, "0009")
        with gate.engine.begin() as connection:
            connection.execute(schema.pool.insert().values(name="pool-1", created=1.0))
            connection.execute(sa.text(
                "INSERT INTO qg_pool_capacity (pool, resource, cap, used) "
                "VALUES ('pool-1', 'gpu', 8, 3)"))
        gate.init()
        assert _slices(gate, "pool-1") == {(0, "gpu"): (3, 8)}
        assert gate.pool("pool-1")["slices"] == 1


ADMITTERS = 8
SUBMITTERS = 2
PER_SUBMITTER = 120


def test_no_slice_and_no_pool_oversold_by_eight_admitting_processes(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_tenant("team-a", {"gpu": 12, "cpu": 80})
        gate.set_tenant("team-b", {"gpu": 10, "cpu": 60})
        gate.set_tenant("team-c", {"gpu": 18, "cpu": 48})
        # Pool caps well below demand, so the processes fight over the last units.
        gate.set_pool("pool-1", {"gpu": 8, "cpu": 48}, slices=4)
        gate.set_pool("pool-2", {"gpu": 6, "cpu": 32}, slices=4)
        gate.set_pool("pool-3", {"gpu": 3, "cpu": 8})
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = context.Queue()
    done: multiprocessing.Queue[int] = context.Queue()
    all_submitted = context.Event()
    processes = [
        context.Process(target=workers.submit_many,
                        args=(db_url, f"s{index}", PER_SUBMITTER, index, results, done))
        for index in range(SUBMITTERS)
    ] + [
        context.Process(target=workers.admit_until_done, args=(db_url, all_submitted, 4, results))
        for _ in range(ADMITTERS)
    ]
    for process in processes:
        process.start()
    for _ in range(SUBMITTERS):
        done.get(timeout=240)
    all_submitted.set()
    answers = [results.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    with Quotagate.connect(db_url) as gate:
        assert gate.check_invariants() == []
        reserved = count(gate, schema.request, schema.request.c.state == "reserved")
        assert reserved == sum(answers) - SUBMITTERS * PER_SUBMITTER > 10
        # Independent recount per slice, straight from the rows.
        with gate.engine.connect() as connection:
            rows = connection.execute(
                sa.select(schema.request.c.pool, schema.request.c.pool_slice,
                          schema.request.c.cost)
                .where(schema.request.c.state == "reserved")).all()
        expected: dict[tuple[str, int, str], int] = defaultdict(int)
        for pool, pool_slice, cost in rows:
            for resource, amount in json.loads(cost).items():
                expected[pool, pool_slice or 0, resource] += amount
        for pool in ("pool-1", "pool-2", "pool-3"):
            for (number, resource), (used, cap) in _slices(gate, pool).items():
                assert used == expected[pool, number, resource] <= cap
        used_slices = {(pool, pool_slice) for pool, pool_slice, _cost in rows
                       if pool in ("pool-1", "pool-2")}
        if gate.engine.dialect.name != "sqlite":
            # Concurrent admitters skip a slice another is charging. SQLite admits one
            # writer at a time, so best fit (decision 042) keeps it on the fullest slice.
            assert len(used_slices) > 2
        assert count(gate, schema.request, schema.request.c.state == "waiting") > 0


def test_after_a_rebalance_small_batches_leave_the_filled_slice_to_the_big_request(
    gate: Quotagate,
) -> None:
    gate.set_tenant("team-a", {"gpu": 16})
    gate.set_pool("pool-1", {"gpu": 8}, slices=4)
    # What an admission that met a fragmented pool does for a request of 4.
    assert run_transaction(gate.engine, partial(pool_slices.rebalance, pool="pool-1",
                                                need={"gpu": 4}))
    rooms = {number: cap - used for (number, _resource), (used, cap) in
             _slices(gate, "pool-1").items()}
    filled = max(rooms, key=lambda number: rooms[number])
    assert rooms[filled] >= 4 and all(room < 4 for number, room in rooms.items()
                                      if number != filled)
    gate.submit("small", "team-a", {"gpu": 1})
    assert [placement.id for placement in gate.admit(1)] == ["small"]
    # Best fit: the small one went where it fits with least room to spare.
    assert _slice_of(gate, "small") != filled
    gate.submit("big", "team-a", {"gpu": 4})
    assert [placement.id for placement in gate.admit(1)] == ["big"]
    assert _slice_of(gate, "big") == filled
    assert gate.check_invariants() == []


def test_a_big_request_among_many_small_concurrent_ones_is_admitted_within_the_rerun_bound(
    db_url: str,
) -> None:
    with Quotagate.connect(db_url) as gate:
        # Slices of 4; the small tenant can never hold more than 8 of the 16, so the
        # pool always has room for the big one, but only after a rebalance.
        gate.set_pool("pool-1", {"gpu": 16}, slices=4)
        gate.set_tenant("small", {"gpu": 8})
        gate.set_tenant("big", {"gpu": 8})
        for index in range(200):
            gate.submit(f"small-{index:03d}", "small", {"gpu": 1})
        assert gate.admit_until_idle(batch=4) == 8
        gate.submit("big", "big", {"gpu": 6})
    jobs = [(lock_order_workers.admit_rounds, (db_url, 30, 2)) for _ in range(3)]
    jobs += [(lock_order_workers.release_rounds, (db_url, 30, 2, seed)) for seed in range(2)]
    answers = race_mixed(jobs)
    assert [bound for kind, _done, _deadlocks, bound in answers if kind == "admit"] == [0, 0, 0]
    with Quotagate.connect(db_url) as gate:
        assert gate.show("big").state != RequestState.WAITING
        assert gate.check_invariants() == []
