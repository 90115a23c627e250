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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from quotagate.delivery import stats
from quotagate.delivery.targets.base import ExternalObject
from quotagate.domain.clock import Clock
from quotagate.domain.lease import Lease
from quotagate.domain.model import RequestState
from quotagate.errors import Conflict, StaleGeneration
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import database_now, reading, run_transaction, supports_skip_locked
from quotagate.store.lease import LeaseStore
from quotagate.store.rows import decode_cost

__all__ = ["Claim", "OutboxStore", "RequestGone"]

_outbox, _request, _binding = schema.outbox, schema.request, schema.binding
_ERROR_LENGTH = 2048


@dataclass(frozen=True)
class Claim:
    """One outbox row held by one worker generation for one delivery attempt."""

    request_id: str
    tenant: str
    target: str | None
    attempts: int
    token: int  # the fencing token this attempt sends downstream
    lease: Lease
    cost: dict[str, int] = field(default_factory=dict)
    payload: Any = None


class RequestGone(Exception):
    """The request left ``reserved`` (cancelled, say) while it was being delivered."""


class OutboxStore:
    def __init__(self, engine: Engine, leases: LeaseStore, clock: Clock) -> None:
        self.engine = engine
        self.leases = leases
        self.clock = clock

    # -- claiming --------------------------------------------------------------

    def claim(self, lease: Lease, limit: int, claim_ttl: float) -> list[Claim]:
        """Claim up to ``limit`` due, undelivered rows for this worker generation.

        Claimable: unclaimed, or the claim expired (by the database clock), or
        claimed by an older generation of this very worker (its lease was
        taken over, so that process is gone or fenced). Rows another worker
        has locked are skipped, not waited for.
        """

        def work(connection: sa.Connection) -> list[Claim]:
            self.leases.fence(connection, lease)
            now = database_now(connection)
            query = (
                sa.select(
                    _outbox.c.request_id, _outbox.c.tenant, _outbox.c.target,
                    _outbox.c.attempts, _outbox.c.claim_token,
                )
                .where(
                    _outbox.c.delivered == sa.false(),
                    _outbox.c.next_attempt_at <= self.clock.now(),
                    sa.or_(
                        _outbox.c.claimed_by.is_(None),
                        _outbox.c.claimed_until < now,
                        sa.and_(
                            _outbox.c.claimed_by == lease.owner,
                            _outbox.c.claim_generation < lease.generation,
                        ),
                    ),
                )
                .order_by(_outbox.c.next_attempt_at, _outbox.c.request_id)
                .limit(limit)
            )
            if supports_skip_locked(connection):
                query = query.with_for_update(skip_locked=True)
            claimed = []
            for row in connection.execute(query).all():
                # Conditioned on the token we read: on SQLite (no row locks,
                # but one writer at a time) and everywhere else alike, a row
                # claimed by someone else in between is simply not ours.
                result = connection.execute(
                    _outbox.update()
                    .where(
                        _outbox.c.request_id == row.request_id,
                        _outbox.c.claim_token == row.claim_token,
                        _outbox.c.delivered == sa.false(),
                    )
                    .values(
                        claimed_by=lease.owner, claim_generation=lease.generation,
                        claimed_until=now + claim_ttl, claim_token=_outbox.c.claim_token + 1,
                    )
                )
                if result.rowcount == 1:
                    claimed.append(row)
            if not claimed:
                return []
            # What the target needs, read once per batch rather than per delivery.
            requests = {
                request.id: request
                for request in connection.execute(
                    sa.select(_request.c.id, _request.c.cost, _request.c.payload).where(
                        _request.c.id.in_([row.request_id for row in claimed])
                    )
                )
            }
            return [
                Claim(
                    row.request_id, row.tenant, row.target, int(row.attempts),
                    int(row.claim_token) + 1, lease,
                    decode_cost(requests[row.request_id].cost),
                    json.loads(requests[row.request_id].payload),
                )
                for row in claimed
                if row.request_id in requests
            ]

        claims = run_transaction(self.engine, work)
        stats.increment("claimed", len(claims))
        return claims

    def fence(self, claim: Claim) -> Callable[[sa.Connection], None]:
        """A check for ``Ledger.release``: lease current and the claim still ours."""

        def check(connection: sa.Connection) -> None:
            self.leases.fence(connection, claim.lease)
            # The release locks the request row next; take it before the outbox
            # row so the lock order stays lease, request, outbox.
            connection.execute(
                sa.select(_request.c.id).where(_request.c.id == claim.request_id)
                .with_for_update()
            ).first()
            self._hold(connection, claim)

        return check

    # -- fenced writes ---------------------------------------------------------

    def record_binding(self, claim: Claim, target: str, obtained: ExternalObject) -> None:
        """Record the external object's identity, once; a replay of the same one is a no-op."""

        def work(connection: sa.Connection) -> None:
            self.leases.fence(connection, claim.lease)
            self._hold(connection, claim)
            existing = connection.execute(
                sa.select(_binding).where(_binding.c.request_id == claim.request_id)
            ).first()
            if existing is not None:
                if existing.external_name != obtained.name or (
                    existing.uid is not None and existing.uid != obtained.uid
                ):
                    raise Conflict(
                        f"request {claim.request_id!r} is already bound to "
                        f"{existing.external_name!r} (uid {existing.uid}), not {obtained.name!r} "
                        f"(uid {obtained.uid})",
                        code="binding_conflict",
                    )
                return
            connection.execute(_binding.insert().values(
                request_id=claim.request_id, target=target, external_name=obtained.name,
                uid=obtained.uid, fencing_token=claim.token, created=self.clock.now(),
            ))

        run_transaction(self.engine, work)

    def mark_delivered(self, claim: Claim, *, actor: str) -> None:
        """Outbox row delivered and request ``delivered``, in one fenced transaction."""

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
            result = connection.execute(
                _request.update()
                .where(_request.c.id == claim.request_id,
                       _request.c.state == RequestState.RESERVED.value)
                .values(state=RequestState.DELIVERED.value, updated=now)
            )
            if result.rowcount != 1:  # pragma: no cover - the row lock above forbids it
                raise RequestGone(claim.request_id)
            record(connection, now, AuditEntry(
                actor, "deliver", "delivered", claim.tenant, claim.request_id,
                f"fencing_token={claim.token}",
            ))

        run_transaction(self.engine, work)
        stats.increment("delivered")

    def record_failure(self, claim: Claim, error: str, retry_at: float) -> None:
        """Count a failed attempt, keep its error, free the row until ``retry_at``."""

        def work(connection: sa.Connection) -> None:
            self.leases.fence(connection, claim.lease)
            self._hold(connection, claim)
            connection.execute(
                _outbox.update().where(_outbox.c.request_id == claim.request_id).values(
                    attempts=_outbox.c.attempts + 1, last_error=error[:_ERROR_LENGTH],
                    next_attempt_at=retry_at, claimed_by=None, claim_generation=None,
                    claimed_until=None,
                )
            )

        run_transaction(self.engine, work)
        stats.increment("retried")

    # -- reads -----------------------------------------------------------------

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

    @staticmethod
    def _hold(connection: sa.Connection, claim: Claim) -> None:
        """Lock the outbox row and check the claim is still this one."""
        row = connection.execute(
            sa.select(_outbox.c.claimed_by, _outbox.c.claim_generation, _outbox.c.claim_token,
                      _outbox.c.delivered)
            .where(_outbox.c.request_id == claim.request_id)
            .with_for_update()
        ).first()
        if row is None:  # released (cancelled, say): its outbox row went with it
            raise RequestGone(claim.request_id)
        if (row.claimed_by, row.claim_generation, row.claim_token, bool(row.delivered)) != (
            claim.lease.owner, claim.lease.generation, claim.token, False,
        ):
            stats.increment("stale_writes")
            raise StaleGeneration(
                f"request {claim.request_id!r}: claim {claim.token} of {claim.lease.owner!r} "
                f"generation {claim.lease.generation} was taken over; write refused",
                code="claim_lost", request_id=claim.request_id,
            )
