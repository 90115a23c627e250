"""Admission's reads on SQLite, kept from one admission to the next while nobody else wrote.

An SQLite admission begins IMMEDIATE: it holds the only write lock. ``PRAGMA
data_version`` on its connection changes iff *another* connection committed
since that connection last looked; the connection's ``total_changes`` grows
with every row it changed itself. So when the admission's connection is the
one the last committed admission ran on, and neither number moved since that
admission's last statement, the database is exactly what that admission left:
its snapshot (as its own charges updated it in memory) and the queue heads it
read (less what it reserved) are still true, and need not be read and parsed
again (docs/decisions/033-sqlite-admission-reuses-its-reads.md).

Only what is provably the same is reused:

- nothing after an attempt that did not commit (a rerun, a rollback, any
  exception): an attempt takes the kept reads away first, and only a commit
  puts them back (:meth:`AdmissionReads.committed`);
- never a snapshot with holds or budgets, whose judgement depends on the clock
  and on reads made apart;
- only the first head read of an attempt, which comes before anything is
  reserved; a later read of the same attempt (a wider window) goes to the
  database, and refreshes what is kept;
- a tenant's heads only as far as they are known: all its waiting requests
  when the read that found them returned fewer than its window, else the
  first ones read (less those reserved since), as many as the window asked.
- no kept heads for a read of the whole window (large batches): after such a
  batch few tenants would have enough left, and sorting them out cost more
  than it saved.

Elsewhere (PostgreSQL, MySQL) every admission reads, as before: a server has
no such counter, and other admitters commit between any two admissions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.placement import Placement
from quotagate.store import cohorts, statements
from quotagate.store.dialect import counts_other_commits, types_union_columns_from_all_parts
from quotagate.store.driver import DriverTransaction
from quotagate.store.head_rows import HeadEntry, head_entries

__all__ = ["AdmissionReads", "KeptHeads", "KeptReads"]

_DATA_VERSION_SQL = "PRAGMA data_version"
_DATA_VERSION = sa.text(_DATA_VERSION_SQL)


@dataclass(slots=True)
class KeptHeads:
    """One tenant's first waiting requests (head entries: quotagate.store.head_rows), in
    queue order."""

    rows: list[HeadEntry]
    # The read that found them returned fewer than it asked for: these are all.
    complete: bool
    # How many that read asked for: the next read of this tenant asks for twice as many.
    depth: int

    def known_to(self, window: int) -> bool:
        """Are the tenant's first ``window`` waiting requests all here: all it has, or at
        least as many?"""
        return self.complete or len(self.rows) >= window


@dataclass(slots=True)
class KeptReads:
    """What one admission read, and where the database stood when it had done."""

    connection: Any  # the sqlite3 connection it ran on (held: its id is never reused)
    data_version: int
    total_changes: int = -1
    snapshot: cohorts.Snapshot | None = None
    heads: dict[str, KeptHeads] = field(default_factory=dict)
    # Head reads not sorted into ``heads`` yet, and requests reserved since (id, tenant):
    # settled only when reads are reused, so that an admission whose reads will not
    # be (another process commits in between, a batch takes more than a window
    # leaves) pays nothing for keeping them.
    unsettled: list[tuple[Sequence[str], int, list[HeadEntry]]] = field(default_factory=list)
    reserved: list[tuple[str, str]] = field(default_factory=list)

    def current(self, connection: Any, data_version: int) -> bool:
        """Is the database still what these reads say, seen from ``connection`` inside a
        transaction holding the write lock (``data_version`` its ``PRAGMA data_version``)?"""
        return (self.snapshot is not None and self.connection is connection
                and self.data_version == data_version
                and self.total_changes == connection.total_changes)

    def settle(self) -> None:
        """Sort the head reads into ``heads``, then drop what was reserved since."""
        heads = self.heads
        for tenants, window, rows in self.unsettled:
            by_tenant: dict[str, list[HeadEntry]] = {tenant: [] for tenant in tenants}
            for entry in rows:
                by_tenant[entry[3].tenant].append(entry)
            for tenant, tenant_rows in by_tenant.items():
                tenant_rows.sort()  # head entries sort in queue order
                heads[tenant] = KeptHeads(tenant_rows, complete=len(tenant_rows) < window,
                                       depth=window)
        self.unsettled.clear()
        for request_id, tenant in self.reserved:
            known = heads.get(tenant)
            if known is None:
                continue
            # Found near the front (admission reserves from the heads it was given):
            # a search that stops there, not a copy of every row kept.
            rows = known.rows
            for index, entry in enumerate(rows):
                if entry[2] == request_id:
                    del rows[index]
                    break
        self.reserved.clear()


@dataclass(slots=True)
class _Attempt:
    """The reads of the admission attempt running in one thread."""

    transaction: DriverTransaction
    reads: KeptReads | None  # None: nothing will be kept from this attempt
    heads_kept: bool  # kept heads may answer its first head read (its snapshot is the kept one)
    heads_read: bool = False


class AdmissionReads:
    """The snapshot and queue heads one ledger's admissions keep between them (SQLite).

    Safe to share between threads: one set of reads is kept, an attempt takes
    it away, and each thread's attempt is its own (another thread's admission
    meanwhile reads the database, and keeps its reads if it commits last).
    """

    def __init__(self, engine: Engine, window: int, *, enabled: bool = True) -> None:
        self._enabled = enabled and counts_other_commits(engine)
        # How many heads of a tenant a read made on reused reads asks for: the
        # ledger's whole window, so that a tenant's next admissions find theirs kept.
        self._window = window
        self._kept: list[KeptReads] = []  # at most one
        self._local = threading.local()

    def snapshot(self, transaction: DriverTransaction) -> cohorts.Snapshot:
        """Begin an attempt: the admission snapshot, the kept one if nothing changed since."""
        if not self._enabled:
            return self._read_snapshot(transaction)
        try:
            kept: KeptReads | None = self._kept.pop()
        except IndexError:
            kept = None
        cursor = transaction.execute(_DATA_VERSION, {})
        (data_version,) = cursor.fetchone()
        connection = cursor.connection
        if kept is not None and kept.current(connection, data_version):
            assert kept.snapshot is not None  # current() says so
            self._local.attempt = _Attempt(transaction, kept, heads_kept=True)
            return kept.snapshot
        snapshot = self._read_snapshot(transaction)
        reads = KeptReads(connection, data_version, snapshot=snapshot)
        self._local.attempt = _Attempt(transaction, reads, heads_kept=False)
        return snapshot

    def take_current(self, cursor: Any) -> KeptReads | None:
        """The kept reads, taken away, if the database is still what they say; else None.

        ``cursor``: on the connection of a transaction that holds the write lock (the steady
        admission's, quotagate.store.steady_admission). Reads no longer true are forgotten;
        reads taken are kept again by :meth:`give_back`.
        """
        if not self._enabled:
            return None
        try:
            kept = self._kept.pop()
        except IndexError:
            return None
        (data_version,) = cursor.execute(_DATA_VERSION_SQL).fetchone()
        return kept if kept.current(cursor.connection, data_version) else None

    def read_anew(self, transaction: DriverTransaction) -> KeptReads:
        """Reads to keep, made now: the admission snapshot, no heads yet (they are read as
        asked, :meth:`read_deeper`). ``transaction`` holds the write lock (the steady
        admission's, after another connection's commit)."""
        cursor = transaction.execute(_DATA_VERSION, {})
        (data_version,) = cursor.fetchone()
        connection = cursor.connection
        return KeptReads(connection, data_version, connection.total_changes,
                         snapshot=self._read_snapshot(transaction))

    def give_back(self, reads: KeptReads) -> None:
        """Keep ``reads`` (taken by :meth:`take_current`) for the next admission: untouched,
        or as a commit left them (``total_changes`` read inside it)."""
        self._kept[:] = [reads]

    def keeping(self, transaction: DriverTransaction) -> bool:
        """Does ``transaction``'s attempt keep its head reads (:meth:`head_entries`)? If not,
        the ledger may read heads as it likes."""
        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        return (attempt is not None and attempt.transaction is transaction
                and attempt.reads is not None)

    def head_entries(
        self, transaction: DriverTransaction, tenants: Sequence[str], window: int
    ) -> list[HeadEntry]:
        """The first ``window`` waiting requests of each of ``tenants``, as head entries
        (:mod:`quotagate.store.head_rows`), in no particular order; a new list."""
        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        if attempt is None or attempt.transaction is not transaction or attempt.reads is None:
            return _read_heads(transaction, tenants, window)
        reads = attempt.reads
        if window >= self._window and not attempt.heads_read:
            # A read of the whole window (a batch of half of it or more) would find
            # kept heads enough only for tenants with fewer waiting: sorting them
            # out costs more than it saves. Read, and keep only this read.
            reads.heads.clear()
            reads.unsettled.clear()
            reads.reserved.clear()
            attempt.heads_kept = False
        if not attempt.heads_kept or attempt.heads_read:
            attempt.heads_read = True
            rows: list[HeadEntry] = _read_heads(transaction, tenants, window)
            reads.unsettled.append((tuple(tenants), window, list(rows)))
            return rows
        attempt.heads_read = True
        reads.settle()
        rows = []
        missing: list[str] = []
        kept = reads.heads
        for tenant in tenants:
            known = kept.get(tenant)
            if known is not None and known.known_to(window):
                rows += known.rows[:window]
            else:
                missing.append(tenant)
        if missing:
            self.read_deeper(reads, transaction, missing, window)
            for tenant in missing:
                rows += reads.heads[tenant].rows[:window]
        return rows

    def read_deeper(self, reads: KeptReads, transaction: DriverTransaction,
                    tenants: Sequence[str], window: int) -> None:
        """Read the heads of ``tenants``, whose kept heads ran short of ``window``, into
        ``reads`` (settled): deeper, so that their next admissions find theirs kept —
        twice as deep as their last read, up to the ledger's window. After another
        process's commit every tenant was read shallow (the first admission's window),
        on a page cache SQLite emptied, and the lock may change hands again within a
        few admissions: rows read 32 deep then are mostly read for nothing
        (docs/decisions/059)."""
        deep = self._window
        for tenant in tenants:
            known = reads.heads.get(tenant)
            # A tenant never read is read as deep as asked, as in a first read.
            deep = min(deep, window if known is None else 2 * known.depth)
        deep = max(window, deep)
        reads.unsettled.append((tenants, deep, _read_heads(transaction, tenants, deep)))
        reads.settle()

    def noting(
        self, work: Callable[[DriverTransaction], list[Placement]]
    ) -> Callable[[DriverTransaction], list[Placement]]:
        """``work`` (an admission attempt), noting at its end what it leaves to keep."""
        if not self._enabled:
            return work

        def attempt(transaction: DriverTransaction) -> list[Placement]:
            self._local.attempt = None
            admitted = work(transaction)
            self._finish(transaction, admitted)
            return admitted

        return attempt

    def committed(self) -> None:
        """The last attempt of this thread committed: keep its reads for the next admission."""
        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        self._local.attempt = None
        if attempt is None or attempt.reads is None or attempt.reads.total_changes < 0:
            return
        self._kept[:] = [attempt.reads]

    def close(self) -> None:
        """Forget the kept reads (and the connection they name)."""
        self._kept.clear()

    def _finish(self, transaction: DriverTransaction, admitted: Sequence[Placement]) -> None:
        """Still inside the transaction: the kept reads, less what it reserved, and the count
        of rows its connection changed (read now: after the commit the pool may lend it)."""
        attempt: _Attempt | None = getattr(self._local, "attempt", None)
        if attempt is None or attempt.transaction is not transaction or attempt.reads is None:
            return
        reads = attempt.reads
        snapshot = reads.snapshot
        if snapshot is None or snapshot.holds or snapshot.budgeted:
            attempt.reads = None  # judged on the clock and on reads made apart
            return
        reads.reserved += [(placement.id, placement.tenant) for placement in admitted]
        reads.total_changes = reads.connection.total_changes

    @staticmethod
    def _read_snapshot(transaction: DriverTransaction) -> cohorts.Snapshot:
        return cohorts.snapshot_from_rows(transaction.rows(statements.admission_snapshot_query(
            typed_nulls=not types_union_columns_from_all_parts(transaction)), {}))


def _read_heads(
    transaction: DriverTransaction, tenants: Sequence[str], window: int
) -> list[HeadEntry]:
    return head_entries(transaction.rows(
        statements.head_query(len(tenants), window), statements.head_parameters(tenants)))

