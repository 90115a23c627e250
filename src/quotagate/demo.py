"""``quotagate demo``: a burst of concurrent tenants and admission workers, end to end.

Several client processes submit at once, several admission processes promise
capacity, and an executor process finishes reserved work so that waiting
requests get their turn. At the end the ledger is checked against invariants
1 and 2; any violation makes the demo fail.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from quotagate.app import Quotagate
from quotagate.domain.model import RequestState
from quotagate.store import schema

TENANTS = {"team-a": {"gpu": 4, "cpu": 32}, "team-b": {"gpu": 2, "cpu": 16},
           "team-c": {"gpu": 3, "cpu": 8}}
POOLS = {"pool-1": {"gpu": 4, "cpu": 32}, "pool-2": {"gpu": 3, "cpu": 24}}


@dataclass(frozen=True)
class DemoSettings:
    url: str
    clients: int = 4
    requests_per_client: int = 50
    admitters: int = 3
    seed: int = 7


def _submit_burst(url: str, client: int, count: int, seed: int) -> None:
    generator = random.Random(seed + client)
    with Quotagate.connect(url) as gate:
        for index in range(count):
            tenant = generator.choice(sorted(TENANTS))
            cost = {"gpu": generator.randint(1, 2), "cpu": generator.randint(1, 6)}
            gate.submit(f"c{client}-job-{index}", tenant, cost,
                        priority=generator.randint(0, 2), payload={"client": client},
                        actor=f"client-{client}")


def _admit(url: str, stop: Any) -> None:
    with Quotagate.connect(url) as gate:
        while not stop.is_set():
            if not gate.admit(4):
                time.sleep(0.02)


def _execute(url: str, stop: Any, seed: int) -> None:
    """Stand-in executor: finishes reserved work a little while after it was promised."""
    generator = random.Random(seed)
    with Quotagate.connect(url) as gate:
        while not stop.is_set():
            with gate.engine.connect() as connection:
                reserved = list(connection.execute(
                    sa.select(schema.request.c.id).where(
                        schema.request.c.state == RequestState.RESERVED.value
                    ).limit(8)
                ).scalars())
            for request_id in reserved:
                if generator.random() < 0.1:
                    gate.fail(request_id, "demo: simulated executor failure", actor="executor")
                else:
                    gate.complete(request_id, actor="executor")
            time.sleep(0.05)


def _counts(gate: Quotagate) -> dict[str, int]:
    with gate.engine.connect() as connection:
        rows = connection.execute(
            sa.select(schema.request.c.state, sa.func.count()).group_by(schema.request.c.state)
        ).all()
    return {state: int(number) for state, number in rows}


def run_demo(settings: DemoSettings, echo: Callable[[str], None]) -> list[str]:
    """Run the demo; return the invariant violations found (empty when all is well)."""
    with Quotagate.connect(settings.url) as gate:
        gate.init()
        for tenant, quota in TENANTS.items():
            gate.set_tenant(tenant, quota, actor="demo")
        for pool, capacity in POOLS.items():
            gate.set_pool(pool, capacity, actor="demo")
        echo(f"tenants: {', '.join(f'{t} {q}' for t, q in TENANTS.items())}")
        echo(f"pools:   {', '.join(f'{p} {c}' for p, c in POOLS.items())}")
        total = settings.clients * settings.requests_per_client
        echo(f"{settings.clients} clients submit {total} requests while "
             f"{settings.admitters} admission workers and an executor run...")
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        clients = [context.Process(target=_submit_burst,
                                   args=(settings.url, n, settings.requests_per_client,
                                         settings.seed))
                   for n in range(settings.clients)]
        workers = [context.Process(target=_admit, args=(settings.url, stop))
                   for _ in range(settings.admitters)]
        workers.append(context.Process(target=_execute, args=(settings.url, stop, settings.seed)))
        started = time.monotonic()
        for process in clients + workers:
            process.start()
        try:
            while True:
                time.sleep(0.5)
                counts = _counts(gate)
                finished = sum(counts.get(s, 0) for s in ("completed", "failed"))
                echo(f"  {time.monotonic() - started:5.1f}s  submitted {sum(counts.values()):4d}"
                     f"  waiting {counts.get('waiting', 0):4d}"
                     f"  reserved {counts.get('reserved', 0):3d}"
                     f"  completed {counts.get('completed', 0):4d}"
                     f"  failed {counts.get('failed', 0):3d}")
                clients_done = all(not process.is_alive() for process in clients)
                if clients_done and finished == total:
                    break
                if any(process.exitcode not in (None, 0) for process in clients + workers):
                    return ["a demo process failed; see its output above"]
                if time.monotonic() - started > 300:
                    return ["the demo did not finish within 300 s"]
        finally:
            stop.set()
            for process in clients + workers:
                process.join(timeout=30)
        echo(f"all {total} requests finished in {time.monotonic() - started:.1f}s")
        violations = gate.check_invariants()
        audit_rows = 0
        with gate.engine.connect() as connection:
            audit_rows = int(connection.execute(
                sa.select(sa.func.count()).select_from(schema.audit)).scalar_one())
        echo(f"audit log: {audit_rows} entries")
        return violations


def default_demo_url() -> str:
    path = Path("quotagate-demo.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"
