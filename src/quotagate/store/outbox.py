"""The outbox, as a worker writes it: claims, bindings, delivery marks, failures.

Every write here is fenced twice, in the transaction that makes it:

* the worker's lease row is locked and must still carry the worker's owner
  *and* generation (a restarted worker of the same name has a newer one);
* the outbox row must still carry this claim (owner, generation and claim
  token), since another worker may have taken an expired claim over.

A write refused by either raises StaleGeneration (counted) and changes nothing.

Lock order, shared with the ledger: lease row, then request row, then outbox row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.domain.clock import Clock
from quotagate.domain.external_object import ExternalObject
from quotagate.domain.lease import Lease
from quotagate.domain.model import FINAL_STATES, RequestState
from quotagate.errors import Conflict, StaleGeneration, quoted
from quotagate.store import outbox_statements as statements
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.authority import ReleaseGuard
from quotagate.store.counters import CounterSink
from quotagate.store.dialect import (
    binds_id_arrays,
    claims_in_one_statement,
    database_now,
    locks_in_lateral_join,
    reading,
    run_transaction,
    supports_skip_locked,
)
from quotagate.store.driver import DriverTransaction, run_on_connection
from quotagate.store.lease import LeaseStore
from quotagate.store.rows import decode_cost

__all__ = ["BatchResult", "Claim", "OutboxStore", "RequestGone"]

_outbox, _request, _binding, _lease = schema.outbox, schema.request, schema.binding, schema.lease
_ERROR_LENGTH = 2048


@dataclass(frozen=True)
class Claim:
    """One outbox row held by one worker generation for one delivery attempt."""

    request_id: str
    tenant: str
    target: str | None
    attempts: int
    fencing_token: int  # sent downstream by this attempt; one higher at every claim
    lease: Lease
    cost: dict[str, int] = field(default_factory=dict)
    payload: Any = None
    stop: bool = False  # a stop to carry out, not a delivery
    # The request's delivery attempt (1, more after a requeue): part of the object's name.
    request_attempt: int = 1


@dataclass
class BatchResult:
    """What a batch write did with each of its deliveries."""

    delivered: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # claim taken over: nothing written
    gone: list[str] = field(default_factory=list)  # cancelled meanwhile: bound, not delivered
    # Ended by its executor while being delivered (docs/decisions/225): nothing written.
    ended: list[str] = field(default_factory=list)
    conflicts: list[tuple[Claim, str]] = field(default_factory=list)


_ENDED = frozenset(state.value for state in FINAL_STATES)


def _by_token(rows: Sequence[Any]) -> dict[int, list[Any]]:
    """Claimable rows (statements.claimable_query's columns) by the claim token they carry."""
    groups: dict[int, list[Any]] = {}
    for row in rows:
        groups.setdefault(int(row[4]), []).append(row)
    return groups


@lru_cache(maxsize=1)
def _hold_query() -> sa.Select[Any]:
    """Lock one outbox row (``held_id``) and read its claim; built once, as every
    fenced end asks (docs/decisions/246)."""
    return (sa.select(_outbox.c.claimed_by, _outbox.c.claim_generation, _outbox.c.claim_token,
                      _outbox.c.delivered, _outbox.c.stopping)
            .where(_outbox.c.request_id == sa.bindparam("held_id")).with_for_update())


@lru_cache(maxsize=1)
def _lock_request_query() -> sa.Select[Any]:
    """Lock one request row (``held_id``): a fenced end's lock before its outbox row's."""
    return (sa.select(_request.c.id).where(_request.c.id == sa.bindparam("held_id"))
            .with_for_update())


class RequestGone(Exception):
    """The request left ``reserved`` (cancelled, say) while it was being delivered."""


class OutboxStore:
    def __init__(self, engine: Engine, leases: LeaseStore, clock: Clock,
                 counters: CounterSink | None = None) -> None:
        self.engine = engine
        self.leases = leases
        self.clock = clock
        self.counters: CounterSink = counters if counters is not None else leases.counters

    # -- claiming --------------------------------------------------------------

    def claim(self, lease: Lease, limit: int, *, stops: bool = False) -> list[Claim]:
        """Claim up to ``limit`` due rows of one kind: deliveries, or (``stops``) stops."""
        if stops:
            return self.claim_work(lease, limit, deliveries=False)
        return self.claim_work(lease, limit, stops=False)

    def claim_work(
        self, lease: Lease, limit: int, *, deliveries: bool = True, stops: bool = True
    ) -> list[Claim]:
        """Claim up to ``limit`` due rows for this worker generation, in one transaction.

        Deliveries: undelivered rows; stops: rows whose request is being
        cancelled (``Claim.stop``). A row is claimable when nobody holds it,
        or when its holder's lease is no longer alive (expired by the
        database clock, or taken over by a newer generation): a claim lives
        exactly as long as the lease it was made under (docs/decisions/212).
        Due is judged by the database clock too; a first attempt is due at
        once, whatever clock wrote the row. Rows another worker has locked are
        skipped, not waited for. The statements run precompiled on the
        transaction's driver cursor (outbox_statements, docs/decisions/253).
        """
        skip_locked = supports_skip_locked(self.engine)
        dialect = self.engine.dialect.name
        kinds = [kind for kind, wanted in ((True, stops), (False, deliveries)) if wanted]
        at_once = claims_in_one_statement(self.engine) and bool(kinds)

        def claim(connection: sa.Connection, transaction: DriverTransaction) -> list[Claim]:
            self.leases.fence(connection, lease)
            if at_once:
                return self._claimed_at_once(transaction, lease, limit, stops, deliveries)
            candidates: list[Any] = []
            for stopping in kinds:
                candidates += transaction.rows(
                    statements.claimable_query(dialect, stopping, limit - len(candidates),
                                               skip_locked), {})
                if len(candidates) >= limit:
                    break
            if not candidates:
                return []
            # One UPDATE per token the rows carried (one, but for retries), conditioned
            # on it: on SQLite (no row locks, but one writer at a time) and everywhere
            # else alike, a row claimed by someone else in between is not ours.
            holder = {"owner": lease.owner, "generation": lease.generation,
                      "until": lease.expires_at}
            updated = 0
            for token, group in _by_token(candidates).items():
                updated += transaction.rowcount(
                    statements.claim_statement(len(group)),
                    {**holder, "token": token,
                     **statements.id_parameters([row[0] for row in group])})
            claimed = candidates
            if updated != len(candidates):
                # Some were claimed by someone else in between: find which are ours.
                ids = [row[0] for row in candidates]
                tokens = {row[0]: int(row[1]) for row in transaction.rows(
                    statements.claimed_tokens_query(len(ids)),
                    {**holder, **statements.id_parameters(ids)})}
                claimed = [row for row in candidates if tokens.get(row[0]) == int(row[4]) + 1]
            if not claimed:
                return []
            # What the target needs, read once per batch rather than per delivery.
            ids = [row[0] for row in claimed]
            requests = {row[0]: row for row in transaction.rows(
                statements.requests_query(len(ids)), statements.id_parameters(ids))}
            return [
                Claim(
                    request_id, tenant, target, int(attempts), int(token) + 1, lease,
                    decode_cost(requests[request_id][1]), json.loads(requests[request_id][2]),
                    stop=bool(stopping), request_attempt=int(requests[request_id][3]),
                )
                for request_id, tenant, target, attempts, token, stopping in claimed
                if request_id in requests
            ]

        def work(connection: sa.Connection) -> list[Claim]:
            return run_on_connection(connection, partial(claim, connection))

        claims = run_transaction(self.engine, work)
        stopping = sum(1 for claim in claims if claim.stop)
        self.counters.increment("stops_claimed", stopping)
        self.counters.increment("claimed", len(claims) - stopping)
        return claims

    @staticmethod
    def _claimed_at_once(transaction: DriverTransaction, lease: Lease, limit: int,
                         stops: bool, deliveries: bool) -> list[Claim]:
        """PostgreSQL: the claim's reads and its UPDATE as one statement
        (outbox_statements.claim_due_statement, docs/decisions/259), in the same order as
        the statements one by one: stops first, each kind oldest due first."""
        rows = transaction.rows(
            statements.claim_due_statement(limit, stops, deliveries),
            {"owner": lease.owner, "generation": lease.generation, "until": lease.expires_at})
        rows.sort(key=lambda row: (not row[5], row[6], row[0]))
        return [
            Claim(request_id, tenant, target, int(attempts), int(token), lease,
                  decode_cost(cost), json.loads(payload), stop=bool(stopping),
                  request_attempt=int(attempt))
            for (request_id, tenant, target, attempts, token, stopping, _due, cost, payload,
                 attempt) in rows
        ]

    def fence(self, claim: Claim) -> Callable[[sa.Connection], None]:
        """A check for ``Ledger.release``: lease current and the claim still ours."""

        def check(connection: sa.Connection) -> None:
            self.leases.fence(connection, claim.lease)
            # The release locks the request row next; take it before the outbox
            # row so the lock order stays lease, request, outbox.
            connection.execute(_lock_request_query(), {"held_id": claim.request_id}).first()
            self._hold(connection, claim)

        return check

    def claim_guard(self, claim: Claim) -> ReleaseGuard:
        """For a batch of releases (``Ledger.release_many``) under the lease's fence: the
        claim still ours, checked on the locked request row's outbox row."""

        def check(connection: sa.Connection, _row: Mapping[str, Any], _to: RequestState) -> None:
            self._hold(connection, claim)

        return check

    # -- fenced writes ---------------------------------------------------------

    def record_deliveries(
        self, lease: Lease, delivered: Sequence[tuple[Claim, str, ExternalObject]], *, actor: str
    ) -> BatchResult:
        """Bindings and ``delivered`` marks of a batch, in one fenced transaction.

        The lease is checked first: a stale generation's batch raises
        StaleGeneration and writes nothing. Then each row's claim is checked; a
        row whose claim was taken over is left out (``lost``), one whose
        request left ``reserved`` meanwhile (a cancel) gets its binding, so the
        stop finds the object, and gives its claim up (``gone``). The statements
        run precompiled on the transaction's driver cursor (docs/decisions/253).
        """
        if not delivered:
            return BatchResult()
        # PostgreSQL locks each outbox row through its key (docs/decisions/254).
        by_key = locks_in_lateral_join(self.engine) and binds_id_arrays(self.engine)

        def write(connection: sa.Connection, transaction: DriverTransaction) -> BatchResult:
            self.leases.fence(connection, lease)
            ids = sorted(claim.request_id for claim, _target, _obtained in delivered)
            by_id = statements.id_parameters(ids)
            # Lock order: lease, request rows, outbox rows (ids sorted alike).
            states = {row[0]: row[1] for row in transaction.rows(
                statements.lock_states_query(len(ids)), by_id)}
            locked = (transaction.rows(statements.lock_claims_by_key_query(), {"ids": ids})
                      if by_key else
                      transaction.rows(statements.lock_claims_query(len(ids)), by_id))
            held = {
                row[0]: (row[1], None if row[2] is None else int(row[2]), int(row[3]),
                         bool(row[4]))
                for row in locked
            }
            # Only a row claimed before can have a binding already (a replay).
            replays = [claim.request_id for claim, _t, _o in delivered if claim.fencing_token > 1]
            existing = {row[0]: ExternalObject(row[1], row[2], row[0]) for row in transaction.rows(
                statements.bindings_query(len(replays)), statements.id_parameters(replays)
            )} if replays else {}
            now = self.clock.now()
            result = BatchResult()
            bindings, marked, entries = [], [], []
            for claim, target, obtained in delivered:
                if claim.request_id not in held and states.get(claim.request_id) in _ENDED:
                    # Its executor called back before this mark and the end took the
                    # outbox row with it: the request is final, there is nothing to record.
                    result.ended.append(claim.request_id)
                    continue
                if held.get(claim.request_id) != (claim.lease.owner, claim.lease.generation,
                                                  claim.fencing_token, False):
                    self.counters.increment("stale_writes")
                    result.lost.append(claim.request_id)
                    continue
                bound = existing.get(claim.request_id)
                if bound is not None and (bound.name != obtained.name or (
                    bound.uid is not None and bound.uid != obtained.uid
                )):
                    result.conflicts.append((claim, (
                        f"request {claim.request_id!r} is already bound to "
                        f"{bound.name!r} (uid {bound.uid}), not {obtained.name!r} "
                        f"(uid {obtained.uid})"
                    )))
                    continue
                if bound is None:
                    bindings.append({
                        "request_id": claim.request_id, "target": target,
                        "external_name": obtained.name, "uid": obtained.uid,
                        "fencing_token": claim.fencing_token, "created": now,
                    })
                if states.get(claim.request_id) != RequestState.RESERVED.value:
                    result.gone.append(claim.request_id)
                    continue
                marked.append(claim.request_id)
                entries.append(AuditEntry(
                    actor, "deliver", "delivered", claim.tenant, claim.request_id,
                    f"fencing_token={claim.fencing_token}",
                ))
            if by_key:  # PostgreSQL: the four writes in one statement (docs/decisions/259)
                if bindings or marked:
                    transaction.write(statements.record_by_arrays_statement(), {
                        "now": now, "actor": actor,
                        "delivered": RequestState.DELIVERED.value,
                        "reserved": RequestState.RESERVED.value,
                        "binding_ids": [row["request_id"] for row in bindings],
                        "binding_targets": [row["target"] for row in bindings],
                        "binding_names": [row["external_name"] for row in bindings],
                        "binding_uids": [row["uid"] for row in bindings],
                        "binding_tokens": [row["fencing_token"] for row in bindings],
                        "marked": marked,
                        "audit_tenants": [entry.tenant for entry in entries],
                        "audit_reasons": [entry.reason for entry in entries],
                    })
                if result.gone:
                    transaction.write(statements.give_up_claims_statement(len(result.gone)),
                                      statements.id_parameters(result.gone))
                result.delivered.extend(marked)
                return result
            # Nothing is read back from these writes: where the driver batches writes
            # (MariaDB, decision 036) they go to the server together, before COMMIT.
            if bindings:
                transaction.write_many(statements.binding_insert(), bindings)
            if result.gone:
                transaction.write(statements.give_up_claims_statement(len(result.gone)),
                                  statements.id_parameters(result.gone))
            if marked:
                marked_ids = {"now": now, **statements.id_parameters(marked)}
                transaction.write(statements.delivered_outbox_statement(len(marked)),
                                  marked_ids)
                transaction.write(statements.mark_delivered_statement(len(marked)), marked_ids)
                record(transaction, now, *entries)
            result.delivered.extend(marked)
            return result

        def work(connection: sa.Connection) -> BatchResult:
            return run_on_connection(connection, partial(write, connection))

        written = run_transaction(self.engine, work)
        self.counters.increment("delivered", len(written.delivered))
        return written

    def record_binding(self, claim: Claim, target: str, obtained: ExternalObject) -> None:
        """One delivery's binding alone (a crash point between binding and ``delivered``)."""
        written = self.record_deliveries(claim.lease, [(claim, target, obtained)],
                                         actor="unused")
        if written.lost:
            raise self._lost(claim)
        if written.conflicts:
            raise Conflict(written.conflicts[0][1], code="binding_conflict")

    def mark_delivered(self, claim: Claim, *, actor: str) -> None:
        """One delivery's binding (already written) and ``delivered`` mark."""

        def work(connection: sa.Connection) -> None:
            self.leases.fence(connection, claim.lease)
            state = connection.execute(
                sa.select(_request.c.state).where(_request.c.id == claim.request_id)
                .with_for_update()
            ).scalar()
            if state != RequestState.RESERVED.value:
                raise RequestGone(claim.request_id)
            self._hold(connection, claim)
            now = self.clock.now()
            connection.execute(
                _outbox.update().where(_outbox.c.request_id == claim.request_id)
                .values(delivered=True, delivered_at=now, claimed_until=None, last_error=None)
            )
            connection.execute(
                _request.update()
                .where(_request.c.id == claim.request_id,
                       _request.c.state == RequestState.RESERVED.value)
                .values(state=RequestState.DELIVERED.value, updated=now)
            )
            record(connection, now, AuditEntry(
                actor, "deliver", "delivered", claim.tenant, claim.request_id,
                f"fencing_token={claim.fencing_token}",
            ))

        run_transaction(self.engine, work)
        self.counters.increment("delivered")

    def record_failure(self, claim: Claim, error: str, retry_in: float) -> None:
        """Count a failed attempt (of a delivery or a stop), keep its error, free the row.

        The row is due again ``retry_in`` seconds from now by the database clock.
        """
        self._record_attempt(claim, retry_in, last_error=error[:_ERROR_LENGTH])

    def record_stop_progress(self, claim: Claim, progress: str, retry_in: float) -> None:
        """Count a stop the target has not confirmed yet but is carrying out; free the row.

        Its answer goes to ``stop_progress`` and ``last_error`` is cleared: a stop under
        way is not a failed attempt (docs/decisions/823).
        """
        self._record_attempt(claim, retry_in, last_error=None,
                             stop_progress=progress[:_ERROR_LENGTH])

    def _record_attempt(self, claim: Claim, retry_in: float, **answer: str | None) -> None:
        def work(connection: sa.Connection) -> None:
            self.leases.fence(connection, claim.lease)
            self._hold(connection, claim)
            connection.execute(
                _outbox.update().where(_outbox.c.request_id == claim.request_id).values(
                    attempts=_outbox.c.attempts + 1,
                    next_attempt_at=database_now(connection) + retry_in, claimed_by=None,
                    claim_generation=None, claimed_until=None, **answer,
                )
            )

        run_transaction(self.engine, work)
        self.counters.increment("retried")

    # -- reads -----------------------------------------------------------------

    def binding_of(self, request_id: str) -> tuple[str, ExternalObject] | None:
        """(target, object) the request is bound to, or None if it never was."""
        with reading(self.engine) as connection:
            row = connection.execute(
                sa.select(_binding).where(_binding.c.request_id == request_id)
            ).first()
        if row is None:
            return None
        return row.target, ExternalObject(row.external_name, row.uid, row.request_id)

    def delivered_bindings(
        self, limit: int, after: str = ""
    ) -> list[tuple[str, str, ExternalObject]]:
        """(tenant, target, object) of delivered requests still charged: outcomes to watch.

        Paged by request id after ``after``, so a worker watching more running
        requests than one page still gets round to every one of them.
        """
        query = (
            sa.select(_request.c.tenant, _binding.c.target, _binding.c.external_name,
                      _binding.c.uid, _binding.c.request_id)
            .select_from(_request.join(_binding, _binding.c.request_id == _request.c.id))
            .where(_request.c.state == RequestState.DELIVERED.value, _request.c.id > after)
            .order_by(_request.c.id)
            .limit(limit)
        )
        with reading(self.engine) as connection:
            return [
                (row.tenant, row.target,
                 ExternalObject(row.external_name, row.uid, row.request_id))
                for row in connection.execute(query)
            ]

    # -- helpers ---------------------------------------------------------------

    def _hold(self, connection: sa.Connection, claim: Claim) -> None:
        """Lock the outbox row and check the claim is still this one."""
        row = connection.execute(_hold_query(), {"held_id": claim.request_id}).first()
        if row is None:  # released (cancelled, say): its outbox row went with it
            raise RequestGone(claim.request_id)
        # A delivery claim is void once the row is delivered; a stop claim is
        # on a row that may well be delivered.
        delivered = bool(row.delivered) and not row.stopping
        if (row.claimed_by, row.claim_generation, row.claim_token, delivered) != (
            claim.lease.owner, claim.lease.generation, claim.fencing_token, False,
        ):
            self.counters.increment("stale_writes")
            raise self._lost(claim)

    @staticmethod
    def _lost(claim: Claim) -> StaleGeneration:
        return StaleGeneration(
            f"request {quoted(claim.request_id)}: claim {claim.fencing_token} of {quoted(claim.lease.owner)} "
            f"generation {claim.lease.generation} was taken over; write refused",
            code="claim_lost", request_id=claim.request_id,
        )
