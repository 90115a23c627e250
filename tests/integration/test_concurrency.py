"""Invariants 1-2 (docs/invariants.md) under real concurrency: separate processes, one database."""

from __future__ import annotations

import json
import multiprocessing
from collections import defaultdict

import pytest
import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.store import schema
from support import workers
from support.ledger_state import count
from support.racing import race

ADMITTERS = 8
SUBMITTERS = 2
PER_SUBMITTER = 120


def _drain(queue: multiprocessing.Queue[int], processes: list[multiprocessing.process.BaseProcess]) -> list[int]:
    results = [queue.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return results


@pytest.mark.parametrize("batch", [1, 4])
def test_no_oversell_with_many_admitting_and_submitting_processes(db_url: str, batch: int) -> None:
    with Quotagate.connect(db_url) as gate:
        # Caps well below demand, so the processes fight over the last units.
        gate.set_tenant("team-a", {"gpu": 6, "cpu": 40})
        gate.set_tenant("team-b", {"gpu": 5, "cpu": 30})
        gate.set_tenant("team-c", {"gpu": 9, "cpu": 24})
        gate.set_pool("pool-1", {"gpu": 8, "cpu": 48})
        gate.set_pool("pool-2", {"gpu": 6, "cpu": 32})
        gate.set_pool("pool-3", {"gpu": 3, "cpu": 8})
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = context.Queue()
    done: multiprocessing.Queue[int] = context.Queue()
    all_submitted = context.Event()
    submitters = [
        context.Process(target=workers.submit_many,
                        args=(db_url, f"s{index}", PER_SUBMITTER, index, results, done))
        for index in range(SUBMITTERS)
    ]
    admitters = [
        context.Process(target=workers.admit_until_done,
                        args=(db_url, all_submitted, batch, results))
        for _ in range(ADMITTERS)
    ]
    for process in submitters + admitters:
        process.start()
    for _ in submitters:
        done.get(timeout=240)
    all_submitted.set()
    submitted = _drain(results, submitters + admitters)
    with Quotagate.connect(db_url) as gate:
        assert count(gate, schema.request) == SUBMITTERS * PER_SUBMITTER
        assert gate.check_invariants() == []
        admitted_by_processes = sum(submitted) - SUBMITTERS * PER_SUBMITTER
        reserved = count(gate, schema.request, schema.request.c.state == "reserved")
        assert reserved == admitted_by_processes == count(gate, schema.outbox)
        # Independent recount of invariant 1, straight from the rows.
        with gate.engine.connect() as connection:
            rows = connection.execute(
                sa.select(schema.request.c.tenant, schema.request.c.pool, schema.request.c.cost)
                .where(schema.request.c.state == "reserved")
            ).all()
        tenant_sum: dict[tuple[str, str], int] = defaultdict(int)
        pool_sum: dict[tuple[str, str], int] = defaultdict(int)
        for tenant, pool, cost in rows:
            for resource, amount in json.loads(cost).items():
                tenant_sum[tenant, resource] += amount
                pool_sum[pool, resource] += amount
        usage = gate.usage()
        for row in usage["tenants"]:
            assert row["used"] == tenant_sum[row["tenant"], row["resource"]] <= row["cap"]
        for row in usage["pools"]:
            assert row["used"] == pool_sum[row["pool"], row["resource"]] <= row["cap"]
        # The caps were the limit, not a lack of work: something is still waiting.
        assert count(gate, schema.request, schema.request.c.state == "waiting") > 0
        assert reserved > 10


def test_concurrent_double_release_returns_the_cost_once(db_url: str) -> None:
    with Quotagate.connect(db_url) as gate:
        gate.set_tenant("team-a", {"gpu": 4})
        gate.set_pool("pool-1", {"gpu": 4})
        gate.submit("job-0", "team-a", {"gpu": 3})
        gate.admit()
    released = race(workers.release_one, db_url, "job-0", processes=4)
    assert sorted(released, key=len) == [{}, {}, {}, {"gpu": 3}]
    with Quotagate.connect(db_url) as gate:
        assert all(row["used"] == 0 for row in gate.usage()["tenants"] + gate.usage()["pools"])
        assert gate.check_invariants() == []
