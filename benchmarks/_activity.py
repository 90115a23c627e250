"""What the database's backends are doing while admitters run, and the CPU they spend.

A thread samples, every few milliseconds, what each session of one database
is doing (PostgreSQL ``pg_stat_activity``: running, waiting on a lock — and
on which table's rows —, on an LWLock, on the WAL, or idle waiting for its
client), and the CPU seconds of every backend process it has seen
(``/proc/<pid>/stat``, kept at the last value read: a backend's counters
vanish with it). MariaDB runs every session as a thread of one server
process, without ``performance_schema`` here: its sessions are sampled from
the processlist and its CPU is the whole server's.

Used by benchmarks/drain_diagnosis.py ``--admitters``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import sqlalchemy as sa

from quotagate.store.engine import create_engine

_TICKS = os.sysconf("SC_CLK_TCK")

_PG_ACTIVITY = """
SELECT a.pid, a.state, a.wait_event_type, a.wait_event,
       (SELECT string_agg(DISTINCT l.relation::regclass::text, ',')
          FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'tuple') AS tuple_on
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend'
"""

_PG_DATABASE = """
SELECT xact_commit, xact_rollback, deadlocks FROM pg_stat_database
WHERE datname = current_database()
"""

_MYSQL_ACTIVITY = """
SELECT id, command, state FROM information_schema.processlist
WHERE db = DATABASE() AND id <> CONNECTION_ID()
"""


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def server_pid(name: str) -> int | None:
    """The pid of the first process whose command name is ``name`` (mariadbd)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as comm:
                    if comm.read().strip() == name:
                        return int(entry)
            except OSError:
                continue
    return None


@dataclass
class Activity:
    """Samples of what the sessions did, and the database-side CPU seconds."""

    samples: Counter[str] = field(default_factory=Counter)
    ticks: int = 0
    server_cpu: float = 0.0
    commits: int = 0
    rollbacks: int = 0
    deadlocks: int = 0


class ActivitySampler:
    """Sample one database's sessions from a thread until :meth:`stop`."""

    def __init__(self, url: str, interval: float = 0.004) -> None:
        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        self.backend = self.engine.dialect.name
        self.interval = interval
        self.activity = Activity()
        self._backend_cpu: dict[int, tuple[float, float]] = {}  # pid: (first, last)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server = server_pid("mariadbd") if self.backend != "postgresql" else None
        self._server_started = cpu_seconds(self._server) if self._server else None
        self._database_started = self._database_counters()

    def _database_counters(self) -> tuple[int, int, int]:
        if self.backend != "postgresql":
            return (0, 0, 0)
        with self.engine.connect() as connection:
            row = connection.exec_driver_sql(_PG_DATABASE).one()
        return int(row[0]), int(row[1]), int(row[2])

    def start(self) -> ActivitySampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        with self.engine.connect() as connection:
            while not self._stopping.is_set():
                self._sample(connection)
                time.sleep(self.interval)

    def _sample(self, connection: sa.Connection) -> None:
        activity = self.activity
        activity.ticks += 1
        if self.backend == "postgresql":
            for pid, state, wait_type, wait_event, tuple_on in connection.exec_driver_sql(
                    _PG_ACTIVITY):
                activity.samples[_pg_label(state, wait_type, wait_event, tuple_on)] += 1
                seen = cpu_seconds(int(pid))
                if seen is not None:
                    first, _last = self._backend_cpu.get(int(pid), (seen, seen))
                    self._backend_cpu[int(pid)] = (first, seen)
            return
        for _id, command, state in connection.exec_driver_sql(_MYSQL_ACTIVITY):
            activity.samples["idle (client)" if command == "Sleep"
                             else f"{command}: {state or '-'}"] += 1

    def stop(self) -> Activity:
        self._stopping.set()
        self._thread.join()
        activity = self.activity
        if self.backend == "postgresql":
            # A backend's CPU from the first sample that saw it: the connection's own
            # start-up (before it) is not admission work.
            activity.server_cpu = sum(last - first for first, last in self._backend_cpu.values())
            commits, rollbacks, deadlocks = self._database_counters()
            started = self._database_started
            activity.commits = commits - started[0]
            activity.rollbacks = rollbacks - started[1]
            activity.deadlocks = deadlocks - started[2]
        elif self._server and self._server_started is not None:
            activity.server_cpu = (cpu_seconds(self._server) or 0.0) - self._server_started
        self.engine.dispose()
        return activity


def _pg_label(state: str | None, wait_type: str | None, wait_event: str | None,
              tuple_on: str | None) -> str:
    if state == "idle":
        return "idle (client between transactions)"
    if state == "idle in transaction":
        return "idle in transaction (client)"
    if wait_type is None:
        return "running"
    label = f"{wait_type}: {wait_event}"
    if wait_type == "Lock" and tuple_on:
        label += f" on {tuple_on}"
    return label
