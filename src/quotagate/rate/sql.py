"""The SQL rate store: token buckets as rows of the SQL database, one transaction per call.

The statements, and why they are written as they are (the database's clock,
MySQL's SET order), are the store's: :mod:`quotagate.store.rate_buckets`. This
module runs them as a :class:`quotagate.rate.backend.RateStore` — each call its
own transaction, retried on conflict, and a take on the store's kept autocommit
connection (:mod:`quotagate.rate.held_takes`, docs/decisions/114).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import BucketConfig, Decision
from quotagate.errors import Conflict, NotFound
from quotagate.rate.backend import Take
from quotagate.rate.held_takes import HeldTakes
from quotagate.rate.keys import BucketKey
from quotagate.store import rate_buckets
from quotagate.store.dialect import reading, rerun_on_conflict, run_transaction
from quotagate.store.driver import run_driver_transaction
from quotagate.store.engine import create_engine, normalise_url, shown_url
from quotagate.store.kept_connection import KeptConnection


class SqlRateStore:
    """Buckets as rows of ``qg_rate_bucket`` in one SQL database.

    On the ledger's own engine the gate calls
    :func:`quotagate.store.rate_buckets.take_in` inside the
    submission's transaction instead, so the token and the request row commit
    or roll back together; the methods here each run their own transaction.
    """

    def __init__(self, engine: Engine, *, owns_engine: bool = False) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        self._pid = os.getpid()
        self._held = HeldTakes(KeptConnection(engine, autocommit=True), engine.dialect,
                               rate_buckets.take_statements(engine.dialect))

    @property
    def description(self) -> str:
        return shown_url(self.engine)

    def shares(self, engine: Engine) -> bool:
        """Whether this store's buckets live in the database ``engine`` writes to."""
        return self.engine is engine or self.engine.url == engine.url

    def configure(self, key: BucketKey, config: BucketConfig, *, fresh: bool) -> float:
        for _ in range(3):
            try:
                return run_transaction(
                    self.engine,
                    lambda connection: rate_buckets.configure_in(
                        connection, key.name, key.tenant, config, fresh=fresh),
                )
            except IntegrityError:
                continue  # created concurrently; run again as a reshape
        raise Conflict(f"rate bucket {key} is being configured concurrently; retry")

    def take(self, key: BucketKey, config: BucketConfig, amount: int = 1) -> Decision:
        # On the store's kept connection, in autocommit: the conditional UPDATE is
        # atomic on its own, and a pool checkout cost more than the UPDATE
        # (docs/decisions/114-sql-takes-on-a-held-connection.md). When another
        # thread has it, through the pool on the driver connection
        # (docs/decisions/112-sql-take-in-autocommit.md).
        done, decision = rerun_on_conflict(lambda: self._held.take(key, amount))
        if not done:
            decision = run_driver_transaction(
                self.engine, lambda transaction: rate_buckets.take_on_driver(transaction, key.name, amount),
                autocommit=True,
            )
        if decision is None:
            raise NotFound(f"rate bucket {key} is not configured in {self.description}",
                           code="unknown_rate_bucket")
        return decision

    def take_many(self, takes: Sequence[Take]) -> list[Decision]:
        # One transaction per take: a batch would hold every row lock until the end.
        return [self.take(item.key, item.config, item.amount) for item in takes]

    def add(self, key: BucketKey, config: BucketConfig, amount: int) -> float:
        tokens = run_transaction(
            self.engine, lambda connection: rate_buckets.add_in(connection, key.name, amount))
        if tokens is None:
            raise NotFound(f"rate bucket {key} is not configured in {self.description}",
                           code="unknown_rate_bucket")
        return tokens

    def peek(self, key: BucketKey, config: BucketConfig) -> float:
        with reading(self.engine) as connection:
            current = rate_buckets.read(connection, key.name)
        if current is None:
            raise NotFound(f"rate bucket {key} is not configured in {self.description}",
                           code="unknown_rate_bucket")
        return current[1]

    def forget(self, key: BucketKey) -> None:
        run_transaction(self.engine,
                        lambda connection: rate_buckets.forget_in(connection, key.name))

    def close(self) -> None:
        self._held.kept.close()
        if self._owns_engine:
            # In a forked child the pooled connections are the parent's: let go, never close.
            self.engine.dispose(close=os.getpid() == self._pid)


def open_sql_store(url: str, ledger_engine: Engine | None) -> SqlRateStore:
    if ledger_engine is not None and normalise_url(url) == ledger_engine.url:
        return SqlRateStore(ledger_engine)
    return SqlRateStore(create_engine(url), owns_engine=True)
