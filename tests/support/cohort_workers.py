"""Processes for the cohort concurrency test (spawned: importable, top level)."""

from __future__ import annotations

import random
from typing import Any

import sqlalchemy as sa

from quotagate import Quotagate
from quotagate.store import schema

# team-a asks for gpu it must borrow, team-b for cpu it must borrow, team-c for
# both within its nominal, team-d has no cohort.
_SHAPES: dict[str, Any] = {
    "team-a": lambda generator: {"gpu": 1, "cpu": 1},
    "team-b": lambda generator: {"cpu": generator.randint(1, 3)},
    "team-c": lambda generator: {"gpu": generator.randint(1, 2), "cpu": generator.randint(1, 2)},
    "team-d": lambda generator: {"gpu": 1, "cpu": generator.randint(1, 2)},
}


def submit_cohort_work(url: str, prefix: str, count: int, seed: int, done: Any) -> None:
    generator = random.Random(seed)
    with Quotagate.connect(url) as gate:
        for index in range(count):
            tenant = generator.choice(sorted(_SHAPES))
            gate.submit(f"{prefix}-{index}", tenant, _SHAPES[tenant](generator),
                        priority=generator.randint(0, 3))
    done.put(count)


def release_some(url: str, count: int, seed: int, done: Any) -> None:
    """Complete ``count`` reserved requests while the admitters run (returns to the rooms)."""
    generator = random.Random(seed)
    released = 0
    with Quotagate.connect(url) as gate:
        while released < count:
            with gate.engine.connect() as connection:
                reserved = list(connection.execute(
                    sa.select(schema.request.c.id)
                    .where(schema.request.c.state == "reserved").order_by(schema.request.c.id)
                ).scalars())
            if not reserved:
                continue
            result = gate.complete(generator.choice(reserved))
            released += bool(result.released)
    done.put(released)


def confirm_stop(url: str, request_id: str, barrier: Any, results: Any) -> None:
    """What a worker does when the target confirmed a stop — raced by several processes."""
    from quotagate.domain.model import RequestState

    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()
        barrier.wait(timeout=120)
        result = gate.ledger.release(request_id, RequestState.CANCELLED, stopped=True)
    results.put(result.released)


def confirm_stops_until(url: str, finished: Any, results: Any) -> None:
    """A stand-in worker: confirms every preempting request's stop until told to finish."""
    from quotagate.domain.model import RequestState

    confirmed = 0
    with Quotagate.connect(url) as gate:
        while not finished.is_set():
            with gate.engine.connect() as connection:
                stopping = list(connection.execute(
                    sa.select(schema.request.c.id)
                    .where(schema.request.c.state == "preempting")).scalars())
            for request_id in stopping:
                confirmed += bool(gate.ledger.release(request_id, RequestState.CANCELLED,
                                                      stopped=True).released)
            finished.wait(0.01)
    results.put(confirmed)


def admit_until(url: str, finished: Any, batch: int, results: Any) -> None:
    admitted = 0
    with Quotagate.connect(url) as gate:
        while not finished.is_set():
            admitted += len(gate.admit(batch))
    results.put(admitted)


def admit_once(url: str, barrier: Any, results: Any) -> None:
    """One admission pass, started together with others (the held-room race)."""
    with Quotagate.connect(url) as gate:
        gate.engine.connect().close()
        barrier.wait(timeout=120)
        results.put([placement.id for placement in gate.admit(limit=8)])
