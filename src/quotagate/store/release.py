"""Batched fenced release: the ends of many requests in one transaction.

Every end (completed, failed, a confirmed stop) returns a request's cost to
its tenant's and its pool's usage rows. One transaction per end made those few
rows the hottest in the database: every end waited for the one before it to
commit (docs/decisions/218). Here a batch of ends is one transaction:

1. the caller's fence, if any (a worker's lease), once for the batch;
2. the batch's request rows locked in id order (``SELECT … FOR UPDATE``; SQLite
   holds its one write lock from ``BEGIN IMMEDIATE``), so a concurrent end of
   the same request waits and then sees the state this batch wrote;
3. each end judged in order on the locked rows by the same rules as a single
   release (its guard, then the transition; the executor guards' facts read for
   the whole round at once, docs/decisions/247); a refused end gets its error and
   writes nothing, the others go on;
4. the state moves, one conditional UPDATE per (from, to, reason) group; on
   PostgreSQL it returns the rows it moved (``UPDATE … RETURNING``, with whether
   their tenants are cohort members, docs/decisions/248) and only those count
   toward the sum, elsewhere the locked rows' count is checked;
5. the summed cost of the rows that moved given back in admission's lock
   order (:mod:`quotagate.store.returns`): plain tenants' rows, members' rows,
   their cohorts' rooms, then the pool rows, each request's cost to the slice
   it was charged to; the outbox rows deleted and the audit rows inserted in
   one statement each;
6. a budgeted tenant's usage accrued: cost * seconds since admission, into its
   hour buckets, its reservation taken back (:func:`quotagate.store.budgets.accrue`);
   with a fair-share half-life, the held time into the tenant's decayed past use
   (:func:`quotagate.store.fair_history.accrue`).

A request's cost therefore comes back once however many callers end it at the
same time: only the transaction that moved its state counts it.

The batch's own statements are built once (:mod:`quotagate.store.release_statements`)
and run precompiled on the driver cursor of the caller's transaction; the fence,
the guards and the rare parts stay on its ``Connection`` (docs/decisions/246).

Lock order, as in :mod:`quotagate.store.ledger` (docs/decisions/041): request
rows, the decision lock (a confirmed stop), plain tenants', members' quota rows,
rooms, pool rows, budget rows (outbox rows of the batch's requests come after the
request rows, and are locked under them by everyone else).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from quotagate.domain.model import (
    CHARGED_STATES,
    STOPPING_STATES,
    Request,
    RequestState,
    validate_reason,
)
from quotagate.errors import Conflict, InvalidInput, NotFound, quoted
from quotagate.store import (
    budgets,
    fair_history,
    requeue,
    returns,
)
from quotagate.store import release_statements as statements
from quotagate.store.audit import AuditEntry, record
from quotagate.store.authority import CallbackFacts, ExecutorGuard, ReleaseGuard, callback_facts
from quotagate.store.dialect import reserves_with_lock
from quotagate.store.driver import DriverTransaction, run_on_connection
from quotagate.store.preemption import COMING_BACK
from quotagate.store.rows import decode_cost, request_from_row

__all__ = ["ENDING_STATES", "End", "ReleaseResult", "lock_decisions", "mark_stop",
           "release_batch"]

ENDING_STATES = frozenset({RequestState.COMPLETED, RequestState.FAILED, RequestState.CANCELLED})
_STOPPABLE = frozenset({RequestState.RESERVED, RequestState.DELIVERED})
# Where an end that must stop the work first leaves it until the target confirms, and
# where the confirmation then ends it: a cancel's (docs/decisions/211), an admin's
# complete or fail (docs/decisions/819).
_STOPPING_FOR = {RequestState.CANCELLED: RequestState.CANCELLING,
                 RequestState.COMPLETED: RequestState.COMPLETING,
                 RequestState.FAILED: RequestState.FAILING}
_VERDICT_OF = {stopping: verdict for verdict, stopping in _STOPPING_FOR.items()}
# The audit operation of a begun stop.
_STOP_OPERATION = {RequestState.CANCELLED: "cancel", RequestState.COMPLETED: "complete",
                   RequestState.FAILED: "fail"}
# Stopping work a preemption decision counts as coming back: the decision's own list
# (a victim's stop, a time limit's and a cancel's, docs/decisions/716).
_DECIDED_STOPS = frozenset(RequestState(state) for state in COMING_BACK)
# Ends of a stop: confirming the stop again finds the request there and does nothing.
_STOPPED = frozenset({RequestState.PREEMPTED, RequestState.TIMED_OUT, RequestState.COMPLETED,
                      RequestState.FAILED})

Fence = Callable[[sa.Connection], None]


@dataclass(frozen=True)
class End:
    """One request to end: what :meth:`quotagate.store.ledger.Ledger.release` takes, as a value."""

    request_id: str
    to_state: RequestState
    reason: str | None = None
    actor: str = "system"
    tenant: str | None = None  # scopes the end: another tenant's request is "not found"
    guard: ReleaseGuard | None = None  # who may end it (quotagate.store.authority)
    stopped: bool = False  # the target confirmed the stop of a stopping request
    # An admin's verdict, not the executor's word: a complete or fail of work an
    # executor may hold stops it first and ends in the verdict once the target
    # confirms (docs/decisions/819). The executor's own word (a worker's outcome
    # read, a callback, the give-up path) leaves it False.
    admin: bool = False
    # An admin's override for a lost executor: end now, even work that may run or is
    # stopping, and return the cost now; audited ``forced`` (docs/decisions/820).
    force: bool = False

    def __post_init__(self) -> None:
        if self.to_state not in ENDING_STATES:
            raise InvalidInput(f"cannot release to state {self.to_state}", code="invalid_state")
        if self.force and (not self.admin or self.stopped
                           or self.to_state == RequestState.CANCELLED):
            raise InvalidInput("force is an admin's complete or fail; a cancel is always a stop",
                               code="invalid_force")
        # Every way in (single, batched, grouped HTTP calls) refuses the same reasons.
        object.__setattr__(self, "reason", validate_reason(self.reason))


@dataclass(frozen=True)
class ReleaseResult:
    request: Request
    released: dict[str, int]


@dataclass(frozen=True)
class _Charge:
    """What a moved charged row gives back, as the statement that moved it saw it."""

    tenant: str
    pool: str
    # The pool slice charged (quotagate.store.pool_slices); None: slice 0.
    pool_slice: int | None
    cost: dict[str, int]
    # Is the tenant a cohort member, as the state move read it; None: not read.
    member: bool | None = None


@dataclass
class _Move:
    index: int
    end: End
    row: dict[str, Any]
    current: RequestState
    # Where the row goes and why: the end's, except for a stop's confirmation, which
    # keeps the reason the stop was asked with (a preemption's, a time limit's, the
    # canceller's). ``audit_reason``: what the target said of a cancel's stop, for
    # the audit entry (None: the audit entry gives ``reason``).
    to_state: RequestState
    reason: str | None
    audit_reason: str | None = None

    @property
    def recorded_reason(self) -> str | None:
        return self.reason if self.audit_reason is None else self.audit_reason


def lock_decisions(transaction: sa.Connection | DriverTransaction) -> None:
    """The ledger-wide lock of preemption decisions (the ledger's identity row)."""
    transaction.execute(statements.lock_decisions_query(), {}).fetchall()


def release_batch(
    connection: sa.Connection, ends: Sequence[End], now: float, fence: Fence | None = None
) -> list[ReleaseResult | Exception]:
    """End ``ends`` in the caller's transaction; one result (or refusal) per end, in order.

    A refusal (NotFound, Conflict, Forbidden, a guard's StaleGeneration …) is
    returned, not raised: it wrote nothing. A database error, or the fence
    refusing, raises and the caller's transaction rolls back whole.

    The release's own statements are precompiled and run on the driver cursor of
    ``connection``'s transaction (docs/decisions/246); the fence, guards and the
    rare parts (requeueing, a budgeted tenant's accrual, fair history) run on
    ``connection`` itself, in the same transaction.
    """
    if fence is not None:
        fence(connection)
    return run_on_connection(
        connection, lambda transaction: _rounds(connection, transaction, ends, now))


def _rounds(
    connection: sa.Connection, transaction: DriverTransaction, ends: Sequence[End], now: float
) -> list[ReleaseResult | Exception]:
    results: list[ReleaseResult | Exception | None] = [None] * len(ends)
    # Ends of one request go to successive rounds, so each round moves a row at most once.
    pending = list(range(len(ends)))
    while pending:
        seen: set[str] = set()
        this_round: list[int] = []
        later: list[int] = []
        for index in pending:
            (later if ends[index].request_id in seen else this_round).append(index)
            seen.add(ends[index].request_id)
        _round(connection, transaction, ends, this_round, now, results)
        pending = later
    return [result if result is not None else RuntimeError("end not judged") for result in results]


def _round(
    connection: sa.Connection, transaction: DriverTransaction, ends: Sequence[End],
    indexes: list[int], now: float, results: list[ReleaseResult | Exception | None],
) -> None:
    ids = sorted({ends[index].request_id for index in indexes})
    columns = statements.REQUEST_COLUMNS
    rows = {
        row[0]: dict(zip(columns, row, strict=True))
        for row in transaction.rows(statements.lock_requests_query(len(ids)), statements.id_parameters(ids))
    }
    facts = _callback_facts(transaction, ends, indexes, rows)
    moves: list[_Move] = []
    requeuing: set[str] | None = None
    for index in indexes:
        end = ends[index]
        try:
            judged = _judge(connection, end, rows.get(end.request_id), facts)
        except DBAPIError:
            raise
        except Exception as error:  # a refusal: this end writes nothing
            results[index] = error
            continue
        if isinstance(judged, ReleaseResult):
            results[index] = judged
        elif judged == "stop":
            results[index] = _begin_stop(transaction, rows[end.request_id], end, now)
        else:
            row = rows[end.request_id]
            current = RequestState(row["state"])
            if current == RequestState.PREEMPTING and not end.force:
                # The victim's confirmed stop (docs/fair-sharing.md#preemption): it ends
                # preempted, or goes back to the queue if its tenant requeues.
                if requeuing is None:
                    requeuing = requeue.tenants_that_requeue(
                        connection, (rows[ends[i].request_id]["tenant"] for i in indexes
                                     if ends[i].request_id in rows))
                if row["tenant"] in requeuing:
                    moves.append(_Move(index, end, row, current, RequestState.WAITING,
                                       requeue.requeue_reason(row)))
                else:
                    moves.append(_Move(index, end, row, current, RequestState.PREEMPTED,
                                       row["reason"]))
            elif current == RequestState.TIMING_OUT and not end.force:
                # Stopped at its max-runtime (docs/decisions/714): it ends timed_out and
                # keeps the reason that names the limit, whatever the target answered.
                moves.append(_Move(index, end, row, current, RequestState.TIMED_OUT,
                                   row["reason"]))
            elif current in _VERDICT_OF and not end.force:
                # A cancel's or an admin's complete or fail of running work, confirmed:
                # it ends as they said, keeping their reason; how the target stopped it
                # is the audit entry's reason (docs/decisions/810, 819).
                moves.append(_Move(index, end, row, current, _VERDICT_OF[current],
                                   row["reason"], end.reason))
            else:
                moves.append(_Move(index, end, row, current, end.to_state, end.reason))
    if not moves:
        return
    if any(move.current in _DECIDED_STOPS for move in moves):
        # Not while a preemption decision reads (Ledger._preempt): it counts this
        # work as coming back, and must not see it vanish with its cost still charged.
        lock_decisions(transaction)
    released = _move_states(transaction, moves, now)
    _return_cost(transaction, released.values())
    # Budgets: what the released work held, admission to now (docs/fair-sharing.md#budgets).
    ended = [move.row for move in moves if move.row["id"] in released]
    budgets.accrue(connection, transaction, ended, now)
    fair_history.accrue(connection, transaction, ended, now)  # with a half-life only
    requeue.requeue(connection, [move.row for move in moves
                                 if move.to_state == RequestState.WAITING
                                 and move.row["id"] in released], now, moves[0].end.actor)
    if released:
        # An undelivered outbox row must not be delivered any more; a stop's row is done.
        gone = sorted(released)
        transaction.execute(statements.outbox_delete_statement(len(gone)), statements.id_parameters(gone))
    record(transaction, now, *(
        AuditEntry(move.end.actor, move.to_state.value,
                   _outcome(move.end, move.row["id"] in released), move.row["tenant"],
                   move.row["id"], move.recorded_reason)
        for move in moves
    ))
    for move in moves:
        move.row.update(state=move.to_state.value, updated=now, reason=move.reason)
        charge = released.get(move.row["id"])
        results[move.index] = ReleaseResult(request_from_row(move.row),
                                            released={} if charge is None else charge.cost)


def _outcome(end: End, released: bool) -> str:
    """The audit outcome of a moved request: a forced end says so (docs/decisions/820)."""
    if end.force:
        return "forced"
    return "released" if released else "ok"


def _callback_facts(
    transaction: DriverTransaction, ends: Sequence[End], indexes: list[int],
    rows: dict[str, dict[str, Any]],
) -> dict[str, CallbackFacts]:
    """The facts every executor callback of this round is judged by, in one read.

    One read per callback was one round trip per end of a group release
    (docs/decisions/247). Read before the round writes anything: a round ends
    each request once, and its only write before the judging is done (a stop
    begun) touches its own request's outbox row, judged already, so every end
    sees what its own read would have.
    """
    guarded = sorted({ends[index].request_id for index in indexes
                      if isinstance(ends[index].guard, ExecutorGuard)
                      and _in_scope(ends[index], rows.get(ends[index].request_id))})
    return callback_facts(transaction, guarded) if guarded else {}


def _in_scope(end: End, row: dict[str, Any] | None) -> bool:
    """Does the end find its request (another tenant's is "not found")?"""
    return row is not None and (end.tenant is None or row["tenant"] == end.tenant)


def _judge(
    connection: sa.Connection, end: End, row: dict[str, Any] | None,
    facts: dict[str, CallbackFacts],
) -> ReleaseResult | str:
    """The rules of one release on a locked row: a no-op result, ``"stop"`` or ``"move"``."""
    if row is None or not _in_scope(end, row):
        raise NotFound(f"request {quoted(end.request_id)} does not exist", code="unknown_request")
    if isinstance(end.guard, ExecutorGuard):
        end.guard.judge(row, end.to_state, facts[row["id"]])
    elif end.guard is not None:
        end.guard(connection, row, end.to_state)
    current = RequestState(row["state"])
    if current == end.to_state or (
        current in _STOPPED and end.to_state == RequestState.CANCELLED and end.stopped
    ):
        # Done already (a preemption's or a time limit's stop confirmed twice ends it once).
        return ReleaseResult(request_from_row(row), released={})
    if end.stopped and current == RequestState.WAITING:
        # A stop confirmed again after its victim was requeued: nothing runs, nothing
        # to return, and the waiting request is not cancelled by it.
        return ReleaseResult(request_from_row(row), released={})
    if end.to_state == RequestState.CANCELLED and current in _STOPPABLE and not end.stopped:
        return "stop"
    if end.admin and not end.force and current in _STOPPABLE and _may_run(connection, row):
        return "stop"  # an admin's complete or fail of work an executor may hold
    if current in STOPPING_STATES and not end.force:
        if end.to_state == RequestState.CANCELLED and not end.stopped:
            return ReleaseResult(request_from_row(row), released={})  # already stopping
        if end.admin and _STOPPING_FOR.get(end.to_state) == current:
            return ReleaseResult(request_from_row(row), released={})  # asked already
        if end.to_state != RequestState.CANCELLED:
            override = "; an admin may force the end (docs/decisions/820)" if end.admin else ""
            raise Conflict(
                f"request {quoted(end.request_id)} is {current.value}; only the confirmed stop "
                f"ends it{override}",
                code="invalid_transition",
            )
    allowed = current in CHARGED_STATES or (
        current == RequestState.WAITING and end.to_state == RequestState.CANCELLED
    )
    if not allowed:
        raise Conflict(
            f"request {quoted(end.request_id)} is {current.value}; it cannot become "
            f"{end.to_state.value}",
            code="invalid_transition",
        )
    return "move"


def _may_run(connection: sa.Connection, row: dict[str, Any]) -> bool:
    """May an executor hold this ``reserved``/``delivered`` work (docs/decisions/819)?

    Delivered work runs. Reserved work may, once a worker took its delivery up (a
    claim, or a failed attempt that may have created the object); before that it
    ends at once, its undelivered outbox row deleted with the end.
    """
    if row["state"] == RequestState.DELIVERED.value:
        return True
    begun = connection.execute(statements.delivery_begun_query(), {"id": row["id"]}).scalar()
    return bool(begun)


def _move_states(
    transaction: DriverTransaction, moves: list[_Move], now: float
) -> dict[str, _Charge]:
    """Move every row's state; what each charged row that moved gives back, by request id."""
    returning = reserves_with_lock(transaction)
    groups: dict[tuple[str, str, str | None], list[_Move]] = {}
    for move in moves:
        key = (move.current.value, move.to_state.value, move.reason)
        groups.setdefault(key, []).append(move)
    released: dict[str, _Charge] = {}
    for (current, to_state, reason), group in groups.items():
        statement = statements.move_statement(len(group), returning)
        parameters: dict[str, Any] = statements.id_parameters([move.row["id"] for move in group])
        parameters.update(current=current, to_state=to_state, now=now, reason=reason)
        charged = RequestState(current) in CHARGED_STATES
        # By request id: tenant, pool, slice, cost, and whether the tenant is a member.
        moved: dict[str, tuple[str, str, int | None, Any, bool | None]]
        if returning:
            # Only rows this statement moved count toward the sum.
            moved = {row[0]: (row[1], row[2], row[3], row[4], bool(row[5]))
                     for row in transaction.rows(statement, parameters)}
        else:
            # The rows are locked (SQLite: the write lock is ours), so the count is exact.
            count = transaction.rowcount(statement, parameters)
            moved = {move.row["id"]: (move.row["tenant"], move.row["pool"],
                                      move.row["pool_slice"], move.row["cost"], None)
                     for move in group}
            if count != len(group):
                moved = {}
        if len(moved) != len(group):
            raise RuntimeError(
                f"ledger inconsistent: {len(group)} locked requests were {current}, "
                f"{len(moved)} moved"
            )
        if charged:
            for request_id, (tenant, pool, pool_slice, cost, member) in moved.items():
                released[request_id] = _Charge(tenant, pool, pool_slice, decode_cost(cost),
                                               member)
    return released


def _return_cost(transaction: DriverTransaction, charges: Iterable[_Charge]) -> None:
    """Give the summed cost back in the lock order (:mod:`quotagate.store.returns`)."""
    tenant_amounts: Counter[tuple[str, str]] = Counter()
    pool_amounts: Counter[tuple[str, int, str]] = Counter()
    # Which tenants are cohort members, when the state move said so for every charge.
    members: set[str] | None = set()
    for charge in charges:
        if charge.member is None:
            members = None
        elif charge.member and members is not None:
            members.add(charge.tenant)
        for resource, amount in charge.cost.items():
            tenant_amounts[charge.tenant, resource] += amount
            # Each request's cost goes back to the slice it was charged to.
            pool_amounts[charge.pool, charge.pool_slice or 0, resource] += amount
    returns.return_cost(transaction, tenant_amounts, pool_amounts, members=members)


def mark_stop(transaction: sa.Connection | DriverTransaction, request_id: str) -> None:
    """Make a charged request's outbox row a stop for a worker (docs/decisions/211).

    Due at once (attempts 0). A delivered row's claim is spent: free it. An
    undelivered row's claim stays with the worker delivering it until its batch
    notices the stop or its lease dies. The caller has moved the request row to
    a stopping state first (request rows before outbox rows, the lock order).
    """
    transaction.execute(statements.mark_stop_statement(), {"stopped_id": request_id})


def _begin_stop(
    transaction: DriverTransaction, row: dict[str, Any], end: End, now: float
) -> ReleaseResult:
    """``reserved``/``delivered`` → ``cancelling`` (``completing``, ``failing``): charged
    until the target confirms."""
    stopping = _STOPPING_FOR[end.to_state]
    transaction.execute(statements.begin_stop_statement(),
                        {"id": row["id"], "current": row["state"], "to_state": stopping.value,
                         "now": now, "reason": end.reason})
    mark_stop(transaction, row["id"])
    record(transaction, now, AuditEntry(end.actor, _STOP_OPERATION[end.to_state], "stopping",
                                       row["tenant"], row["id"], end.reason))
    row.update(state=stopping.value, updated=now, reason=end.reason)
    return ReleaseResult(request_from_row(row), released={})
