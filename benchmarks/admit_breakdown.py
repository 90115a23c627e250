"""Where one ``admit(1)`` spends its CPU time, next to the raw transaction, in one process.

    .venv/bin/python benchmarks/admit_breakdown.py [--backend sqlite|postgresql|mysql]
        [--admissions 400] [--chunks 7] [--batch 16]

On SQLite (no network) what ``Ledger.admit`` costs beyond the raw transaction
(``_raw_admission.py``) is Python and the extra work of its statements; on
PostgreSQL CPU time leaves out the waits on the server, so it shows the same
thing. This prints, on one throwaway ledger:

1. CPU time per admission (``time.process_time``: the machine's other load
   inflates wall times by a factor of several, CPU time much less) of the raw
   transaction, the raw transaction with the audit row ``Ledger.admit`` writes
   too (docs/decisions/032), and ``Ledger.admit(1)`` (with ``--batch N``
   ``Ledger.admit(N)`` too, per admission), interleaved chunk by chunk; the
   median of the chunks and the ratios;
2. the same admissions statement by statement: CPU time inside the driver's
   (sqlite3's, psycopg's, PyMySQL's) ``execute``/``fetchall``/``commit`` per admission,
   the rest being Python; psycopg's ``BEGIN`` is sent inside the first ``execute``.
   PyMySQL's ``execute`` includes its Python: formatting and escaping the
   parameters into the query string, reading the reply packets.

The per-statement timing adds about a microsecond per call to both sides.

On MariaDB (a server on this machine) the comparison also gives the server's
CPU per admission: the CPU time of each connection's own server thread
(``information_schema.processlist.tid``, read from ``/proc/<server>/task/<tid>/schedstat``),
which other clients of the same server do not touch. Two thirds of an
admission's CPU there is the server's (docs/decisions/054).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from _databases import throwaway_database
from _raw_admission import RawAdmission
from admit import ROOMY, TENANTS, bulk_insert, configure, reset, waiting_rows
from quotagate.store.engine import create_engine
from quotagate.store.ledger import Ledger

_SPENT: Counter[str] = Counter()


def _label(sql: str) -> str:
    """A statement's first words: enough to tell the admission's statements apart."""
    return " ".join(sql.split()[:3])[:40]


class _TimedCalls:
    """Adds the CPU time of each driver call to ``_SPENT``, by statement: mixed into the
    cursor class of each driver (sqlite3, psycopg, PyMySQL), whose calls it wraps."""

    last = ""

    def execute(self, query: Any, *parameters: Any, **options: Any) -> Any:
        started = time.process_time()
        super().execute(query, *parameters, **options)  # type: ignore[misc]
        self.last = _label(str(query))
        _SPENT[self.last] += time.process_time() - started
        return self

    def executemany(self, query: Any, *parameters: Any, **options: Any) -> Any:
        started = time.process_time()
        super().executemany(query, *parameters, **options)  # type: ignore[misc]
        _SPENT[_label(str(query))] += time.process_time() - started
        return self

    def fetchall(self) -> Any:
        started = time.process_time()
        rows = super().fetchall()  # type: ignore[misc]
        _SPENT[f"{self.last} (fetch)"] += time.process_time() - started
        return rows

    def fetchone(self) -> Any:
        started = time.process_time()
        row = super().fetchone()  # type: ignore[misc]
        _SPENT[f"{self.last} (fetch)"] += time.process_time() - started
        return row


class _TimedCommit:
    """Adds the CPU time of ``commit`` to ``_SPENT``: mixed into a driver's connection class."""

    def commit(self) -> None:
        started = time.process_time()
        super().commit()  # type: ignore[misc]
        _SPENT["COMMIT"] += time.process_time() - started


class _TimedCursor(_TimedCalls, sqlite3.Cursor):
    pass


class _TimedConnection(_TimedCommit, sqlite3.Connection):
    def cursor(self, factory: Any = _TimedCursor) -> Any:
        return super().cursor(factory)


def _timed_connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None,
                           factory=_TimedConnection)


def _timed_pg_connect(url: str) -> Any:
    import psycopg

    class TimedPgCursor(_TimedCalls, psycopg.Cursor[Any]):
        pass

    class TimedPgConnection(_TimedCommit, psycopg.Connection[Any]):
        pass

    # Admission executes on psycopg's RawCursor, which it makes itself
    # (quotagate.store.dialect.raw_cursor): the module's class is replaced by a
    # timed one for this process.
    if not issubclass(psycopg.RawCursor, _TimedCalls):
        psycopg.RawCursor = type(  # type: ignore[misc]
            "TimedPgRawCursor", (_TimedCalls, psycopg.RawCursor), {})

    parsed = make_url(url)
    timed = TimedPgConnection.connect(host=parsed.host, port=parsed.port or 5432,
                                      user=parsed.username, password=parsed.password,
                                      dbname=parsed.database)
    timed.cursor_factory = TimedPgCursor
    return timed


def _timed_mysql_connect(url: str, *, found_rows: bool = True) -> Any:
    """A PyMySQL connection whose cursors and commits are timed.

    ``found_rows``: a row count counts the rows matched, not only the changed ones,
    as SQLAlchemy's MySQL dialect connects (quotagate's engine); the raw baseline
    connects without it."""
    import pymysql
    from pymysql.connections import Connection
    from pymysql.cursors import Cursor

    class TimedMySqlCursor(_TimedCalls, Cursor):  # type: ignore[misc]
        pass

    class TimedMySqlConnection(_TimedCommit, Connection):  # type: ignore[misc]
        pass

    parsed = make_url(url)
    timed = TimedMySqlConnection(
        host=parsed.host or "127.0.0.1", port=parsed.port or 3306,
        user=parsed.username or "root", password=parsed.password or "",
        database=parsed.database, autocommit=False, cursorclass=TimedMySqlCursor,
        client_flag=pymysql.constants.CLIENT.FOUND_ROWS if found_rows else 0,
    )
    return timed


def _admitters(
    url: str, timed: bool, batch: int = 1
) -> tuple[dict[str, Callable[[], int]], Ledger, dict[str, RawAdmission]]:
    raw, audited = RawAdmission(url, TENANTS), RawAdmission(url, TENANTS, audit=True)
    backend = make_url(url).get_backend_name()
    engine = create_engine(url)
    if timed:
        engine.dispose()
        engine = create_engine(url, creator=partial(_timed_connection, url, backend))
        for baseline in (raw, audited):
            baseline.connection.close()
            baseline.connection = _timed_connection(url, backend, baseline=True)
    ledger = Ledger(engine)
    admitters = {"raw": raw.admit_one, "raw + audit row": audited.admit_one,
                 "admit(1)": lambda: len(ledger.admit(1))}
    if batch > 1:
        admitters[f"admit({batch})"] = lambda: len(ledger.admit(batch))
    return admitters, ledger, {"raw": raw, "raw + audit row": audited}


def _timed_connection(url: str, backend: str, baseline: bool = False) -> Any:
    """A timed driver connection; for a ``baseline``, set up as ``RawAdmission`` sets its own."""
    if backend == "postgresql":
        connection = _timed_pg_connect(url)
        if baseline:
            connection.isolation_level = 1  # psycopg.IsolationLevel.READ_COMMITTED
        return connection
    if backend == "mysql":
        connection = _timed_mysql_connect(url, found_rows=not baseline)
        if baseline:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return connection
    connection = _timed_connect(url.removeprefix("sqlite:///"))
    if baseline:
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
            connection.execute(f"PRAGMA {pragma}")
    return connection


class _ServerThreads:
    """CPU time of the MariaDB server threads serving some connections, where the server
    runs on this machine (its threads are under /proc); else it measures nothing."""

    def __init__(self) -> None:
        self.server = next((entry for entry in os.listdir("/proc") if entry.isdigit()
                            and _command(entry) in ("mariadbd", "mysqld")), None)
        self.threads: dict[str, list[int]] = {}

    def add(self, kind: str, connection: Any) -> None:
        """Follow ``connection``'s (a PyMySQL connection's) server thread for ``kind``."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT tid FROM information_schema.processlist"
                           " WHERE id = CONNECTION_ID()")
            (thread,) = cursor.fetchone()
        connection.commit()
        if self.server and os.path.exists(f"/proc/{self.server}/task/{thread}"):
            self.threads.setdefault(kind, []).append(int(thread))

    def nanoseconds(self, kind: str) -> int | None:
        if kind not in self.threads:
            return None
        total = 0
        for thread in self.threads[kind]:
            try:
                with open(f"/proc/{self.server}/task/{thread}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except FileNotFoundError:  # the connection closed: its thread is gone
                continue
        return total


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def _cpu_per_admission(admit: Callable[[], int], count: int,
                       server: Callable[[], int | None] = lambda: None) -> tuple[float, float | None]:
    """Client CPU µs per admission over ``count`` admissions (the calls of a batch admit
    several), and the server threads' (``server``: their nanoseconds so far), if known."""
    started, admitted, server_started = time.process_time(), 0, server()
    while admitted < count:
        got = admit()
        if not got:
            break
        admitted += got
    client = (time.process_time() - started) / max(admitted, 1) * 1e6
    server_now = server()
    if server_started is None or server_now is None:
        return client, None
    return client, (server_now - server_started) / max(admitted, 1) / 1e3


def compare(url: str, admissions: int, chunks: int, batch: int = 1) -> list[list[str]]:
    admitters, ledger, baselines = _admitters(url, timed=False, batch=batch)
    threads = _ServerThreads()
    if make_url(url).get_backend_name() == "mysql":
        for kind, baseline in baselines.items():
            threads.add(kind, baseline.connection)
        # Every connection the ledger opens from now on (the pool emptied first).
        sa.event.listen(ledger.engine, "connect",
                        lambda connection, _record: threads.add("ledger", connection))
        ledger.engine.dispose()
    for admit in admitters.values():
        for _ in range(10):  # warm up: connections, statement caches, the first expiry pass
            admit()
    spent: dict[str, list[float]] = {kind: [] for kind in admitters}
    served: dict[str, list[float]] = {kind: [] for kind in admitters}
    for _ in range(chunks):
        for kind, admit in admitters.items():
            client, server = _cpu_per_admission(admit, admissions, partial(
                threads.nanoseconds, kind if kind in baselines else "ledger"))
            spent[kind].append(client)
            if server is not None:
                served[kind].append(server)
    ledger.close()
    ledger.engine.dispose()
    ours = statistics.median(spent["admit(1)"])
    rows = [[kind, f"{statistics.median(values):.0f}", f"{statistics.median(values) / ours:.2f}x"]
            for kind, values in spent.items()]
    if all(served.values()):
        both = {kind: statistics.median(spent[kind]) + statistics.median(served[kind])
                for kind in admitters}
        for row, kind in zip(rows, admitters, strict=True):
            row += [f"{statistics.median(served[kind]):.0f}", f"{both[kind]:.0f}",
                    f"{both[kind] / both['admit(1)']:.2f}x"]
    return rows


def breakdown(url: str, admissions: int) -> tuple[list[str], list[list[str]]]:
    admitters, ledger, _baselines = _admitters(url, timed=True)
    columns: list[str] = []
    cells: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    for kind in ("raw", "admit(1)"):
        admit = admitters[kind]
        for _ in range(10):
            admit()
        _SPENT.clear()
        started = time.process_time()
        admitted = sum(admit() for _ in range(admissions))
        totals[kind] = (time.process_time() - started) / admitted * 1e6
        cells[kind] = {name: seconds / admitted * 1e6 for name, seconds in _SPENT.items()}
        columns.append(kind)
    ledger.close()
    ledger.engine.dispose()
    rows: list[list[str]] = []
    for kind in columns:
        for name, micros in sorted(cells[kind].items(), key=lambda item: -item[1]):
            rows.append([kind, name, f"{micros:.1f}"])
        native = sum(cells[kind].values())
        rows.append([kind, "Python (the rest)", f"{totals[kind] - native:.1f}"])
        rows.append([kind, "total", f"{totals[kind]:.1f}"])
    return columns, rows


def main(argv: Sequence[str] | None = None) -> int:
    from quotagate.cli.common import render_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "mysql"), default="sqlite")
    parser.add_argument("--admissions", type=int, default=400, help="admissions per chunk")
    parser.add_argument("--chunks", type=int, default=7, help="interleaved chunks per kind")
    parser.add_argument("--queue", type=int, default=30_000, help="waiting requests")
    parser.add_argument("--batch", type=int, default=1,
                        help="also admit(N), CPU per admission (the comparison only)")
    arguments = parser.parse_args(argv)
    with throwaway_database(arguments.backend) as url:
        engine = create_engine(url)
        configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
        bulk_insert(engine, waiting_rows(arguments.queue, TENANTS, prefix="bd",
                                         start=time.time() - 600, span=300, priority=0))
        rows = compare(url, arguments.admissions, arguments.chunks, arguments.batch)
        print("CPU µs per admission (median of chunks), and as a multiple of admit(1)'s")
        header = ["kind", "µs", "of admit(1)"]
        if len(rows[0]) > len(header):  # MariaDB on this machine: its server threads too
            header += ["server µs", "client + server µs", "of admit(1)"]
        print(render_table(header, rows))
        reset(engine)
        _columns, detail = breakdown(url, arguments.admissions * 3)
        print("\nCPU µs per admission, statement by statement (inside the driver)")
        print(render_table(["kind", "call", "µs"], detail))
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
