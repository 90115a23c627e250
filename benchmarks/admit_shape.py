"""SQLite: the raw transaction in the shape of ours, next to raw and ``admit(1)``, CPU by statement.

    .venv/bin/python benchmarks/admit_shape.py [--rounds 5] [--admissions 1200]

``Ledger.admit(1)`` on SQLite keeps its reads between admissions (docs/decisions/033),
writes an audit row (032) and reserves before it charges; the raw baseline
(``_raw_admission.py``) reads everything every time, writes no audit row and
charges first. This writes the raw transaction in ours' shape, step by step:

- ``raw + audit row``: the baseline with ours' audit row;
- ``raw + audit, reads kept``: its usage and heads read again only when
  ``PRAGMA data_version`` says another connection committed, as ours;
- ``the same, reserve first``: ours' statement order too.

All run interleaved in one process on one throwaway ledger (30,000 waiting),
each timed statement by statement inside the driver (``admit_breakdown``'s timed
connections); the rest of each is its Python. What ``admit(1)`` spends beyond the
last one is its own Python and what that does to the statements around it
(docs/performance.md, "SQLite `admit(1)`: three driver-level trims").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from _databases import throwaway_database
from _raw_admission import RawAdmission
from admit import ROOMY, TENANTS, bulk_insert, configure, waiting_rows
from admit_breakdown import _SPENT, _admitters, _timed_connection
from quotagate.store.engine import create_engine

# Heads kept per read: enough that a kept read lasts a while, re-read below _LOW.
_KEPT_HEADS, _LOW = 64, 8


class _KeptReads(RawAdmission):
    """The raw transaction that keeps its reads while no other connection commits."""

    def __init__(self, url: str, tenants: Sequence[str]) -> None:
        super().__init__(url, tenants, audit=True)
        self._kept: tuple[dict[str, dict[str, tuple[int, int]]],
                          dict[str, dict[str, tuple[int, int]]], list[Any]] | None = None
        self._version: int | None = None

    def _transaction(self) -> int:
        cursor = self.connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute("PRAGMA data_version")
        (version,) = cursor.fetchone()
        if self._kept is None or version != self._version:
            self._version = version
            tenants, pools = self._read_usage(cursor)
            cursor.execute(self._heads_sql.replace(" LIMIT 4)", f" LIMIT {_KEPT_HEADS})"),
                           self.tenants)
            heads = sorted(cursor.fetchall(), key=lambda row: (row[4], row[5], row[0]))
            self._kept = (tenants, pools, heads)
        tenants, pools, heads = self._kept
        for index, (request_id, tenant, _cost, target, _key, _created), cost, pool in \
                self._fitting(heads, tenants, pools):
            self._reserve(cursor, request_id, tenant, target, pool, cost)
            self.connection.commit()
            del heads[index]
            for usage in (tenants[tenant], pools[pool]):
                for resource, amount in cost.items():
                    used, cap = usage[resource]
                    usage[resource] = (used + amount, cap)
            if len(heads) < _LOW:
                self._kept = None
            return 1
        self.connection.commit()
        self._kept = None
        return 0


class _ReserveFirst(_KeptReads):
    """:class:`_KeptReads` in ours' statement order: reserve, charges, outbox row, audit row."""

    def _reserve(self, cursor: Any, request_id: str, tenant: str, target: str | None,
                 pool: str, cost: dict[str, int]) -> None:
        now = time.time()
        cursor.execute(self._reserve_sql, (pool, now, request_id))
        if cursor.rowcount != 1:
            raise RuntimeError(f"{request_id} was not waiting")  # one writer: never
        for statement, holder in ((self._charge_tenant_sql, tenant), (self._charge_pool_sql, pool)):
            for resource, amount in sorted(cost.items()):
                cursor.execute(statement, (amount, holder, resource, amount))
                if cursor.rowcount != 1:
                    raise RuntimeError(f"{holder} {resource} had no room")  # ROOMY: never
        cursor.execute(self._outbox_sql, (request_id, tenant, target, now, now, False))
        cursor.execute(self._audit_sql, (now, tenant, request_id, f"pool={pool}"))


def main(argv: Sequence[str] | None = None) -> int:
    from quotagate.cli.common import render_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--admissions", type=int, default=1200, help="per kind and round")
    arguments = parser.parse_args(argv)
    with throwaway_database("sqlite") as url:
        engine = create_engine(url)
        configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
        bulk_insert(engine, waiting_rows(30_000, TENANTS, prefix="sh",
                                         start=time.time() - 600, span=300, priority=0))
        engine.dispose()
        admitters, ledger, baselines = _admitters(url, timed=True)
        shaped = {"raw + audit, reads kept": _KeptReads(url, TENANTS),
                  "the same, reserve first": _ReserveFirst(url, TENANTS)}
        for side in shaped.values():
            side.connection.close()
            side.connection = _timed_connection(url, "sqlite", baseline=True)
        kinds: dict[str, Callable[[], int]] = {
            "raw": admitters["raw"], "raw + audit row": admitters["raw + audit row"],
            **{name: side.admit_one for name, side in shaped.items()},
            "admit(1)": admitters["admit(1)"],
        }
        spent: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for _ in range(arguments.rounds):
            for kind, admit in kinds.items():
                for _ in range(10):  # each kind's first admission after another's re-reads
                    admit()
                _SPENT.clear()
                started = time.process_time()
                admitted = sum(admit() for _ in range(arguments.admissions))
                total = (time.process_time() - started) / max(admitted, 1) * 1e6
                calls = {name: seconds / max(admitted, 1) * 1e6 for name, seconds in _SPENT.items()}
                spent[kind].append({**calls, "total": total})
        ledger.close()
        ledger.engine.dispose()
        for side in [*shaped.values(), *baselines.values()]:
            side.close()
    columns = ["total", "Python", "BEGIN IMMEDIATE", "UPDATE qg_request SET",
               "INSERT INTO qg_outbox", "INSERT INTO qg_audit", "COMMIT"]
    rows = []
    for kind, runs in spent.items():
        median = {name: statistics.median(run.get(name, 0.0) for run in runs)
                  for name in {name for run in runs for name in run}}
        median["Python"] = median["total"] - sum(v for k, v in median.items() if k != "total")
        ratios = [raw["total"] / run["total"] for raw, run in zip(spent["raw"], runs, strict=True)]
        rows.append([kind, *(f"{median.get(column, 0.0):.1f}" for column in columns),
                     f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"])
    print("CPU µs per admission (medians of rounds); raw/this per round")
    print(render_table(["kind", *columns, "raw/this"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
