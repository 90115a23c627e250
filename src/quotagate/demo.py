"""``quotagate demo``: a burst of concurrent tenants, admission and delivery, end to end.

Several client processes submit at once, several admission processes promise
capacity, and two delivery workers run each admitted request once through a
local process target; when a command exits, its cost goes back and waiting
requests get their turn. At the end the ledger is checked against docs/invariants.md,
1 and 2; any violation makes the demo fail.
"""

from __future__ import annotations

import multiprocessing
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quotagate.app import Quotagate

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
    run_dir: str = "quotagate-demo-runs"


def _submit_burst(url: str, client: int, count: int, seed: int) -> None:
    generator = random.Random(seed + client)
    with Quotagate.connect(url) as gate:
        for index in range(count):
            tenant = generator.choice(sorted(TENANTS))
            cost = {"gpu": generator.randint(1, 2), "cpu": generator.randint(1, 6)}
            # About one in ten commands fails, to show failures releasing their cost too.
            payload = {"client": client, "fail": generator.random() < 0.1}
            gate.submit(f"c{client}-job-{index}", tenant, cost,
                        priority=generator.randint(0, 2), payload=payload,
                        actor=f"client-{client}")


def _admit(url: str, stop: Any) -> None:
    with Quotagate.connect(url) as gate:
        while not stop.is_set():
            if not gate.admit(4):
                time.sleep(0.02)


def _deliver(url: str, stop: Any, name: str) -> None:
    from quotagate.delivery.dispatcher import Dispatcher

    with Quotagate.connect(url) as gate:
        Dispatcher(gate, worker_name=name, lease_ttl=5, poll_interval=0.05).run(stop)


def _configure_executor(gate: Quotagate, run_dir: Path) -> None:
    """A process target whose command 'serves' for a moment; payloads asking to fail exit 3."""
    # Old run directories would be read back as the outcome of the same ids.
    shutil.rmtree(run_dir, ignore_errors=True)
    gate.set_target(
        "demo-executor", "process",
        {"command": ["sh", "-c", 'sleep 0.2; case "$QUOTAGATE_PAYLOAD" in *true*) exit 3;; esac'],
         "run_dir": str(run_dir)},
        default=True, actor="demo",
    )


def run_demo(settings: DemoSettings, echo: Callable[[str], None]) -> list[str]:
    """Run the demo; return the invariant violations found (empty when all is well)."""
    with Quotagate.connect(settings.url) as gate:
        gate.init()
        for tenant, quota in TENANTS.items():
            gate.set_tenant(tenant, quota, actor="demo")
        for pool, capacity in POOLS.items():
            gate.set_pool(pool, capacity, actor="demo")
        run_dir = Path(settings.run_dir).resolve()
        _configure_executor(gate, run_dir)
        echo(f"tenants: {', '.join(f'{t} {q}' for t, q in TENANTS.items())}")
        echo(f"pools:   {', '.join(f'{p} {c}' for p, c in POOLS.items())}")
        total = settings.clients * settings.requests_per_client
        echo(f"executor: process target 'demo-executor', one run directory per request "
             f"under {run_dir}")
        echo(f"{settings.clients} clients submit {total} requests while "
             f"{settings.admitters} admission workers and 2 delivery workers run...")
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        clients = [context.Process(target=_submit_burst,
                                   args=(settings.url, n, settings.requests_per_client,
                                         settings.seed))
                   for n in range(settings.clients)]
        workers = [context.Process(target=_admit, args=(settings.url, stop))
                   for _ in range(settings.admitters)]
        workers += [context.Process(target=_deliver, args=(settings.url, stop, f"demo-worker-{n}"))
                    for n in (1, 2)]
        started = time.monotonic()
        for process in clients + workers:
            process.start()
        try:
            while True:
                time.sleep(0.5)
                counts = gate.state_counts()
                finished = sum(counts.get(s, 0) for s in ("completed", "failed"))
                echo(f"  {time.monotonic() - started:5.1f}s  submitted {sum(counts.values()):4d}"
                     f"  waiting {counts.get('waiting', 0):4d}"
                     f"  reserved {counts.get('reserved', 0):3d}"
                     f"  delivered {counts.get('delivered', 0):3d}"
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
        echo(f"audit log: {gate.audit_size()} entries")
        return violations


def default_demo_url() -> str:
    path = Path("quotagate-demo.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"
