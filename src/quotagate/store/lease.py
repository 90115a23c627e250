"""Generational leases in SQL: one conditional UPDATE decides each step.

Expiry is judged by the database's clock (``dialect.database_now``), never the
worker's: two machines with skewed clocks still agree on who holds a lease.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.lease import Lease, validate_lease_name, validate_owner, validate_ttl
from quotagate.errors import NotFound, StaleGeneration, quoted
from quotagate.store import schema
from quotagate.store.counters import CounterSink, delivery_counters
from quotagate.store.dialect import database_now, reading, run_transaction

__all__ = ["LeaseStore"]

_lease = schema.lease


@lru_cache(maxsize=1)
def _fence_query() -> sa.Select[Any]:
    """A lease (``fenced_name``) read under a shared lock: every fenced write asks, so it
    is built once (docs/decisions/246)."""
    return (sa.select(_lease.c.owner, _lease.c.generation)
            .where(_lease.c.name == sa.bindparam("fenced_name")).with_for_update(read=True))


def _lease_from_row(row: Any) -> Lease:
    return Lease(
        name=row.name, owner=row.owner, generation=int(row.generation),
        expires_at=float(row.expires_at),
    )


def _stale_error(lease: Lease, what: str) -> StaleGeneration:
    return StaleGeneration(
        f"{what} refused: lease {quoted(lease.name)} generation {lease.generation} of "
        f"{quoted(lease.owner)} is no longer current; a newer generation holds it",
        lease=lease.name, owner=lease.owner, generation=lease.generation,
    )


class LeaseStore:
    def __init__(self, engine: Engine, *, counters: CounterSink | None = None) -> None:
        self.engine = engine
        # Counted where the app exports them (Quotagate.delivery_counters), or privately.
        self.counters: CounterSink = counters if counters is not None else delivery_counters()

    def _stale(self, lease: Lease, what: str) -> StaleGeneration:
        """The error (counted) for a write refused because the lease moved on."""
        self.counters.increment("stale_writes")
        return _stale_error(lease, what)

    def acquire(self, name: str, owner: str, ttl: float) -> Lease | None:
        """Take the lease if it is free or expired; ``None`` if someone holds it.

        Success always moves the generation on, even for the owner's own name:
        a restarted worker must not inherit its dead predecessor's token.
        """
        validate_lease_name(name)
        validate_owner(owner)
        ttl = validate_ttl(ttl)
        self._ensure_row(name)

        def work(connection: sa.Connection) -> Lease | None:
            now = database_now(connection)
            result = connection.execute(
                _lease.update()
                .where(
                    _lease.c.name == name,
                    sa.or_(_lease.c.owner.is_(None), _lease.c.expires_at < now),
                )
                .values(owner=owner, generation=_lease.c.generation + 1, expires_at=now + ttl)
            )
            if result.rowcount != 1:
                return None
            return self._read(connection, name)

        lease = run_transaction(self.engine, work)
        if lease is not None:
            self.counters.increment("leases_acquired")
        return lease

    def renew(self, lease: Lease, ttl: float) -> Lease:
        """Extend the lease; raise StaleGeneration if a newer generation holds it.

        Renewal is conditioned on owner and generation only: a holder whose
        lease ran out but was not taken over may still renew, since nobody
        else can have written with a newer token in between.
        """
        ttl = validate_ttl(ttl)

        def work(connection: sa.Connection) -> Lease:
            now = database_now(connection)
            result = connection.execute(
                _lease.update()
                .where(*self._held(lease))
                .values(expires_at=now + ttl)
            )
            if result.rowcount != 1:
                raise self._stale(lease, "lease renewal")
            return self._read(connection, lease.name)

        try:
            return run_transaction(self.engine, work)
        except StaleGeneration:
            self.counters.increment("leases_lost")
            raise

    def release(self, lease: Lease) -> bool:
        """Give the lease up so the next worker need not wait for expiry.

        The generation stays: it only ever grows. Returns False (and counts a
        stale write) when a newer generation already holds the lease.
        """

        def work(connection: sa.Connection) -> bool:
            result = connection.execute(
                _lease.update()
                .where(*self._held(lease))
                .values(owner=None, expires_at=database_now(connection))
            )
            return result.rowcount == 1

        released = run_transaction(self.engine, work)
        if not released:
            self._stale(lease, "lease release")
        return released

    def fence(self, connection: sa.Connection, lease: Lease) -> None:
        """Inside a worker's transaction: lock the lease row and check it is still ours.

        The locking read orders this transaction against a takeover: either the
        takeover waits for our commit (and its holder sees our writes), or we
        see its new generation here and refuse. Raises StaleGeneration.

        A shared lock is enough for that (a takeover is an UPDATE, which waits
        for it), and it lets one worker's own fenced transactions overlap: the
        batch being written and the next batch being claimed (docs/decisions/216).
        """
        row = connection.execute(_fence_query(), {"fenced_name": lease.name}).first()
        if row is None or row.owner != lease.owner or int(row.generation) != lease.generation:
            raise self._stale(lease, "fenced write")

    def get(self, name: str) -> Lease:
        with reading(self.engine) as connection:
            row = connection.execute(sa.select(_lease).where(_lease.c.name == name)).first()
        if row is None:
            raise NotFound(f"lease {quoted(name)} does not exist", code="unknown_lease")
        return _lease_from_row(row)

    def list(self) -> tuple[float, list[Lease]]:
        """The database's clock now and every lease, by name."""
        with reading(self.engine) as connection:
            now = float(connection.execute(sa.select(database_now(connection))).scalar_one())
            rows = connection.execute(sa.select(_lease).order_by(_lease.c.name)).all()
        return now, [_lease_from_row(row) for row in rows]

    # -- helpers ---------------------------------------------------------------

    @staticmethod
    def _held(lease: Lease) -> tuple[sa.ColumnElement[bool], ...]:
        return (
            _lease.c.name == lease.name,
            _lease.c.owner == lease.owner,
            _lease.c.generation == lease.generation,
        )

    @staticmethod
    def _read(connection: sa.Connection, name: str) -> Lease:
        row = connection.execute(sa.select(_lease).where(_lease.c.name == name)).one()
        return _lease_from_row(row)

    def _ensure_row(self, name: str) -> None:
        """Create the lease row, free, if it does not exist yet (race-safe)."""

        def work(connection: sa.Connection) -> None:
            exists = connection.execute(
                sa.select(_lease.c.name).where(_lease.c.name == name)
            ).first()
            if exists is None:
                connection.execute(
                    _lease.insert().values(name=name, owner=None, generation=0, expires_at=0.0)
                )

        # IntegrityError: another worker created it first, exactly what we wanted.
        with contextlib.suppress(IntegrityError):
            run_transaction(self.engine, work)
