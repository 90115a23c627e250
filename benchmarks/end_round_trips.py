"""How many round trips one group release of N ends takes (docs/decisions/247).

    .venv/bin/python benchmarks/end_round_trips.py [--backend postgresql] [--ends 1 16]

On one throwaway ledger with a default target, each size submits, admits, claims
and records the delivery of N requests (as a worker does), then ends them in one
``Ledger.release_many`` three ways: executor callbacks (each end with its
executor guard and fencing token, as ``serve``'s group release writes them), a
worker's ends under its lease fence (``--outcome read``), and plain completions
(``benchmarks/cancel_stops.py --end complete``). Counted at the driver, so the
statements SQLAlchemy's ``Connection`` runs and those on its DBAPI cursor both
count: every ``cursor.execute`` (an ``executemany`` as one: psycopg pipelines it)
and every command the driver sends itself (BEGIN, COMMIT, ROLLBACK). SQLite has no round trips, so it is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from _databases import throwaway_database
from quotagate import Quotagate
from quotagate.delivery.registry import TargetStore
from quotagate.domain.external_object import ExternalObject
from quotagate.domain.model import RequestState
from quotagate.store.authority import executor_guard
from quotagate.store.outbox import OutboxStore
from quotagate.store.release import End

_count = [0]
_shown: list[str] = []


def _counting(method: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        _count[0] += 1
        what = args[1] if len(args) > 1 else ""
        if isinstance(what, bytes):
            what = what.decode(errors="replace")
        elif isinstance(what, int):  # PyMySQL's command byte: the SQL follows it
            what = args[2] if len(args) > 2 else what
        _shown.append(" ".join(str(what)[:110].split()))
        return method(*args, **kwargs)
    return counted


@contextlib.contextmanager
def _patched(backend: str) -> Iterator[None]:
    """Count what the driver sends (see the module's docstring)."""
    patches: list[tuple[Any, str, Any]] = []
    if backend == "postgresql":
        import psycopg
        patches = [(psycopg.Cursor, "execute", psycopg.Cursor.execute),
                   (psycopg.Cursor, "executemany", psycopg.Cursor.executemany),
                   (psycopg.Connection, "_exec_command", psycopg.Connection._exec_command)]
    elif backend == "mysql":
        import pymysql.connections
        patches = [(pymysql.connections.Connection, "_execute_command",
                    pymysql.connections.Connection._execute_command)]
    else:
        raise SystemExit("round trips are a server's: --backend postgresql or mysql")
    for owner, name, method in patches:
        setattr(owner, name, _counting(method))
    try:
        yield
    finally:
        for owner, name, method in patches:
            setattr(owner, name, method)


def _delivered(gate: Quotagate, outbox: OutboxStore, prefix: str, count: int
               ) -> dict[str, int]:
    """``count`` requests admitted, claimed and recorded delivered; their fencing tokens."""
    ids = [f"{prefix}-{index:04d}" for index in range(count)]
    for request_id in ids:
        gate.submit(request_id, "team-a", {"gpu": 1})
    assert gate.admit_until_idle() == count
    lease = gate.leases.acquire(f"worker-{prefix}", "bench", 60.0)
    assert lease is not None
    claims = outbox.claim_work(lease, count, stops=False)
    assert len(claims) == count
    outbox.record_deliveries(lease, [
        (claim, "hook", ExternalObject(f"obj-{claim.request_id}", None, claim.request_id))
        for claim in claims], actor="bench")
    return {claim.request_id: claim.fencing_token for claim in claims}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="postgresql", choices=("postgresql", "mysql"))
    parser.add_argument("--ends", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--show", action="store_true", help="print each command counted")
    options = parser.parse_args()
    with throwaway_database(options.backend) as url, Quotagate.connect(url) as gate:
        total = 3 * sum(options.ends)
        gate.set_pool("pool-1", {"gpu": total})
        gate.set_tenant("team-a", {"gpu": total})
        TargetStore(gate.engine).set("hook", "webhook", {"url": "http://127.0.0.1:9/"},
                                     default=True)
        outbox = OutboxStore(gate.engine, gate.leases, gate.clock)
        gate.ledger.release_many([])  # imports and compiles outside the count
        for size in options.ends:
            for mode in ("callback", "fenced", "plain"):
                tokens = _delivered(gate, outbox, f"{mode}{size}", size)
                fence = None
                if mode == "callback":
                    ends = [End(request_id, RequestState.COMPLETED, actor="executor:hook",
                                guard=executor_guard("hook", token))
                            for request_id, token in tokens.items()]
                else:
                    ends = [End(request_id, RequestState.COMPLETED) for request_id in tokens]
                if mode == "fenced":
                    lease = gate.leases.acquire(f"ender-{size}", "bench", 60.0)
                    assert lease is not None
                    held = lease

                    def fence(connection: Any, held: Any = held) -> None:
                        gate.leases.fence(connection, held)
                _count[0] = 0
                _shown.clear()
                with _patched(options.backend):
                    results = gate.ledger.release_many(ends, fence=fence)
                counted = _count[0]
                assert all(not isinstance(result, Exception) and result.released == {"gpu": 1}
                           for result in results), results
                print(f"{options.backend} {mode:8} ends={size:3} round trips={counted}")
                if options.show:
                    print("".join(f"    {line}\n" for line in _shown), end="")


if __name__ == "__main__":
    main()
