"""Functions run in child processes by the concurrency tests (importable for spawn)."""

from __future__ import annotations

import random
import time
from typing import Any

from quotagate import Quotagate


def admit_until_done(url: str, submitted: Any, batch: int, results: Any) -> None:
    """Admit until the submitters are done and nothing waiting fits any more."""
    admitted = 0
    with Quotagate.connect(url) as gate:
        while True:
            finished = submitted.is_set()
            placed = gate.admit(batch)
            admitted += len(placed)
            if not placed:
                if finished:
                    break
                time.sleep(0.01)
    results.put(admitted)


def submit_many(url: str, prefix: str, count: int, seed: int, results: Any,
                done: Any = None) -> None:
    generator = random.Random(seed)
    created = 0
    with Quotagate.connect(url) as gate:
        for index in range(count):
            tenant = generator.choice(["team-a", "team-b", "team-c"])
            cost = {"gpu": generator.randint(1, 2), "cpu": generator.randint(1, 8)}
            if generator.random() < 0.3:
                cost = {"cpu": generator.randint(1, 4)}
            result = gate.submit(f"{prefix}-{index}", tenant, cost, priority=generator.randint(0, 3))
            created += result.created
    results.put(created)
    if done is not None:
        done.put(1)


def release_one(url: str, request_id: str, barrier: Any, results: Any) -> None:
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()  # connect before the race starts
        barrier.wait(timeout=120)  # a worker that died never leaves the others waiting
        result = gate.complete(request_id)
    results.put(result.released)


def open_new_database(url: str, barrier: Any, results: Any) -> None:
    """Open a ledger on a file that does not exist yet, together with the other openers."""
    from quotagate.store.engine import create_engine

    engine = create_engine(url)
    barrier.wait(timeout=120)
    with engine.connect() as connection:
        results.put(connection.exec_driver_sql("PRAGMA journal_mode").scalar_one())
    engine.dispose()


def end_in_batches(url: str, request_ids: list[str], state: str, seed: int, batch: int,
                   barrier: Any, results: Any) -> None:
    """End ``request_ids`` (shuffled) with ``Ledger.release_many``, ``batch`` per transaction.

    Puts ``(ids this process released, summed cost it was given back)``.
    """
    from quotagate.domain.model import RequestState
    from quotagate.store.release import End

    ids = list(request_ids)
    random.Random(seed).shuffle(ids)
    released: list[str] = []
    returned: dict[str, int] = {}
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()  # connect before the race starts
        barrier.wait(timeout=120)  # a worker that died never leaves the others waiting
        for start in range(0, len(ids), batch):
            ends = [End(request_id, RequestState(state), actor=f"ender-{seed}")
                    for request_id in ids[start:start + batch]]
            for end, result in zip(ends, gate.ledger.release_many(ends), strict=True):
                if isinstance(result, Exception):
                    continue  # another process ended it first (Conflict)
                if result.released:
                    released.append(end.request_id)
                    for resource, amount in result.released.items():
                        returned[resource] = returned.get(resource, 0) + amount
    results.put((released, returned))


def submit_in_batches(url: str, tenant: str, request_ids: list[str], seed: int, batch: int,
                      results: Any) -> None:
    """Submit ``request_ids`` (shuffled) with ``Quotagate.submit_many``, ``batch`` per call;
    report which ids this process was told were created, and any refusals."""
    ids = list(request_ids)
    random.Random(seed).shuffle(ids)
    created: list[str] = []
    errors: list[str] = []
    with Quotagate.connect(url) as gate:
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            answers = gate.submit_many(tenant, [{"id": request_id, "cost": {"gpu": 1}}
                                                for request_id in chunk])
            for request_id, answer in zip(chunk, answers, strict=True):
                if isinstance(answer, Exception):
                    errors.append(f"{request_id}: {answer}")
                elif answer.created:
                    created.append(request_id)
    results.put({"created": created, "errors": errors})


def admit_count(url: str, count: int, results: Any) -> None:
    """Admit ``count`` requests one by one; report their ids."""
    with Quotagate.connect(url) as gate:
        results.put([placement.id for _ in range(count) for placement in gate.admit(1)])
