"""SQLite ``admit(1)`` on the reads the last admission left: one short transaction.

On SQLite an admitting process mostly takes the write lock again right after its
own commit, with nothing changed since but what it wrote itself
(quotagate.store.admission_reads). Its next ``admit(1)`` is then decided by the
kept snapshot and queue heads alone, and what it writes is always the same five
statements. Run through the general admission (the driver transaction, the
attempt's bookkeeping, the batch planner's fair order and the batch writers),
that decision cost some 80 µs of Python over a 150 µs raw transaction; here it is
the statements, compiled once, on the kept connection's cursor, and
:func:`quotagate.domain.placement.place_first` for the choice
(docs/decisions/061-steady-sqlite-admission.md).

Only what is provably the general admission's result is decided here:

- the reads are current (the transaction holds the write lock and ``PRAGMA
  data_version`` and the connection's change count say nobody else wrote since they
  were made);
- no tenant is a cohort member, no tenant has a budget, no room is held for a
  preemptor and no pool is sliced: each changes what fits or how it is charged;
- the choice is made on the heads the general admission looks at, in its two looks:
  each open tenant's first few (``first_window``), then, if none of those fits and
  some queue is longer, its whole window; a tenant whose kept heads are too short for
  a look is read further first, as the general admission would
  (``AdmissionReads.read_deeper``).

Reads another connection's commit made stale are read anew first (the snapshot;
the heads as the choice asks for them), as the general admission would read them.
Anything else runs the general admission's work in the same transaction, with the
write lock already held, as if it had begun it. Anything that fails rolls back and leaves the admission to the general
path, which runs it again from the start as one of its reruns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from quotagate.domain.clock import Clock
from quotagate.domain.placement import Placement, has_room, place_first
from quotagate.domain.placement import charge as charge_usage
from quotagate.store import fair_history, schema, statements
from quotagate.store.admission_reads import AdmissionReads, KeptReads
from quotagate.store.dialect import begin_statement
from quotagate.store.driver import DriverTransaction, compiled_for_driver, hand_back, roll_back
from quotagate.store.kept_connection import KeptConnection

__all__ = ["SteadyAdmission"]

Bind = Callable[[dict[str, Any]], Any]


class _Unexpected(Exception):
    """A write that cannot miss under the write lock missed: leave it to the general path."""


class SteadyAdmission:
    """``admit(1)`` on one ledger's kept reads and kept connection (SQLite)."""

    def __init__(self, engine: Engine, reads: AdmissionReads, kept: KeptConnection,
                 clock: Clock, first_window: int, admission_window: int,
                 begin_waited: Callable[[float], None]) -> None:
        dialect = engine.dialect
        self._dialect = dialect
        self._hide_parameters = engine.hide_parameters
        self._driver_error: type[Exception] = dialect.loaded_dbapi.Error
        begin = begin_statement(engine)
        assert begin is not None, "the steady admission is SQLite's: its BEGIN takes the lock"
        self._begin = begin
        self._reads, self._kept, self._clock = reads, kept, clock
        self._windows = (first_window, admission_window) if first_window < admission_window \
            else (admission_window,)
        self._begin_waited = begin_waited

        def compiled(statement: Any) -> tuple[str, Bind]:
            found = compiled_for_driver(dialect, statement)
            return found.sql, found.bind

        self._reserve = compiled(statements.reserve_statement(1))
        self._charge_tenant = compiled(statements.charge_row_statement(schema.tenant_quota, "tenant"))
        self._charge_pool = compiled(
            statements.charge_row_statement(schema.pool_capacity, "pool", sliced=True))
        self._outbox = compiled(statements.outbox_insert())
        self._audit = compiled(statements.admission_audit_insert())
        self._carry_token = compiled(statements.carry_token_statement())

    def admit(self, actor: str,
              general: Callable[[DriverTransaction], list[Placement]]) -> list[Placement] | None:
        """Admit at most one request; None if nothing was done here (no kept connection, or
        the attempt failed and rolled back): the caller runs the general admission.

        ``general``: the general admission's work for one request, run in this
        transaction when the kept reads cannot decide (see the module's text), wrapped
        by :meth:`AdmissionReads.noting`.
        """
        pooled = self._kept.take()
        if pooled is None:
            return None
        connection = pooled.dbapi_connection
        cursor = connection.cursor()
        committed = False
        try:
            started = time.perf_counter()
            try:
                cursor.execute(self._begin)
            finally:  # a BEGIN that gave up (busy) waited too
                self._begin_waited(time.perf_counter() - started)
            # After another connection's commit: the snapshot read anew, the heads as asked.
            reads = self._reads.take_current(cursor) or self._reads.read_anew(
                self._transaction(cursor))
            decided = self._admit_on(reads, cursor, actor)
            if decided is None:
                self._reads.give_back(reads)  # true still: the general work reuses them
                admitted = general(self._transaction(cursor))
            else:
                admitted = decided
            connection.commit()
            committed = True
            if decided is None:
                self._reads.committed()  # what the general work read is kept as usual
            else:
                self._reads.give_back(reads)
            return admitted
        except Exception:
            if committed:
                raise  # admitted already: a second admission must not follow
            # Whatever it was, the general path's reruns deal with it, from the start.
            if pooled.dbapi_connection is not None:
                roll_back(pooled, self._driver_error)
            return None
        except BaseException:
            if pooled.dbapi_connection is not None:
                roll_back(pooled, self._driver_error)
            raise
        finally:
            cursor.close()
            if not (committed and self._kept.keep(pooled)):
                hand_back(pooled, committed)

    def _transaction(self, cursor: Any) -> DriverTransaction:
        """The general admission's view of this transaction."""
        return DriverTransaction(self._dialect, cursor, hide_parameters=self._hide_parameters)

    def _admit_on(self, reads: KeptReads, cursor: Any, actor: str) -> list[Placement] | None:
        """Decide on ``reads`` and write the admission, if any; None if they cannot decide."""
        snapshot = reads.snapshot
        assert snapshot is not None  # current reads have one
        if snapshot.sharing.roots or snapshot.budgeted or snapshot.holds or snapshot.slices:
            return None
        reads.settle()
        tenants, pools = snapshot.tenants, snapshot.pools
        open_tenants = [tenant for tenant, usage in tenants.items() if has_room(usage)]
        if not open_tenants or not any(map(has_room, pools.values())):
            return []
        now = self._clock.now()
        history = fair_history.history(snapshot, now)
        # The general admission's two looks (Ledger._fill): the first few heads of each
        # queue, then, if none fits and some queue is longer, the whole window.
        for window in self._windows:
            queues = self._queues(reads, cursor, open_tenants, window)
            chosen = place_first(queues, tenants, pools, snapshot.weights, history, window)
            if chosen is not None or all(len(rows) < window for _tenant, rows in queues):
                break
        if chosen is None:
            return []
        entry, pool = chosen
        candidate = entry[3]
        placement = Placement(candidate.id, candidate.tenant, pool, candidate.cost,
                              candidate.runtime)
        self._write(cursor, placement, entry[4], entry[5], now, actor)
        charge_usage(tenants[placement.tenant], placement.cost)
        charge_usage(snapshot.pools[pool], placement.cost)
        reads.reserved.append((placement.id, placement.tenant))
        # Read inside the transaction, as the general admission does (AdmissionReads._finish).
        reads.total_changes = cursor.connection.total_changes
        return [placement]

    def _queues(self, reads: KeptReads, cursor: Any, tenants: list[str],
                window: int) -> list[tuple[str, list[Any]]]:
        """``tenants``' kept heads, each known at least ``window`` deep (or all of it): a
        tenant whose kept heads ran short is read further first, as the general admission
        would (a few admissions in a hundred)."""
        kept = reads.heads
        short = [tenant for tenant in tenants
                 if (heads := kept.get(tenant)) is None or not heads.known_to(window)]
        if short:
            self._reads.read_deeper(reads, self._transaction(cursor), short, window)
        return [(tenant, kept[tenant].rows) for tenant in tenants]

    def _write(self, cursor: Any, placement: Placement, target: str | None, floor: Any,
               now: float, actor: str) -> None:
        """The general admission's statements for one request, in its order (the reserve,
        tenant rows, pool rows, outbox row, audit row; docs/decisions/041's lock order)."""
        sql, bind = self._reserve
        cursor.execute(sql, bind(statements.reserve_parameters((placement,), now)))
        if cursor.rowcount != 1:
            raise _Unexpected(placement.id)
        cost = placement.cost
        for (sql, bind), rows in (
            (self._charge_tenant, statements.charge_row_parameters(
                {(placement.tenant, resource): amount for resource, amount in cost.items()})),
            (self._charge_pool, statements.sliced_charge_row_parameters(
                {(placement.pool, 0, resource): amount for resource, amount in cost.items()})),
        ):
            cursor.executemany(sql, [bind(row) for row in rows])
            if cursor.rowcount != len(rows):
                raise _Unexpected(placement.id)
        sql, bind = self._outbox
        cursor.execute(sql, bind(statements.outbox_row(placement, target, now)))
        sql, bind = self._audit
        cursor.execute(sql, bind(statements.admission_audit_row(placement, now, actor)))
        if floor:  # a requeued request: its tokens go on above the stopped attempt's
            sql, bind = self._carry_token
            cursor.execute(sql, bind({"request_id": placement.id, "token": int(floor)}))
