"""The SQL rate store: token buckets as rows of the SQL database, one transaction per call.

The statements, and why they are written as they are (the database's clock,
MySQL's SET order), are the store's: :mod:`quotagate.store.rate_buckets`. This
module runs them as a :class:`quotagate.rate.backend.RateStore` — each call its
own transaction, retried on conflict, and a take on the store's kept autocommit
connection (:mod:`quotagate.rate.held_takes`, docs/decisions/114).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import BucketConfig, Decision
from quotagate.errors import Conflict, NotFound, StoreUnavailable
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
        # A store of its own (not the ledger's database) on SQLite: the file, until it was
        # seen to exist. Opening a missing file would create it empty (see _own_errors).
        self._unseen_file: Path | None = (
            Path(str(engine.url.database)).expanduser()
            if owns_engine and engine.dialect.name == "sqlite" else None)
        self._pid = os.getpid()
        self._held = HeldTakes(KeptConnection(engine, autocommit=True), engine.dialect,
                               rate_buckets.take_statements(engine.dialect))

    @property
    def description(self) -> str:
        return shown_url(self.engine)

    def shares(self, engine: Engine) -> bool:
        """Whether this store's buckets live in the database ``engine`` writes to."""
        return self.engine is engine or self.engine.url == engine.url

    @contextlib.contextmanager
    def _own_errors(self) -> Iterator[None]:
        """Errors of a store in a database of its own, as that store's.

        The SQL layer words them for the ledger database ("the ledger schema is
        missing … run 'quotagate init'", which the CLI follows with the ledger's URL):
        of a separate store that names the wrong database and no command that helps.
        A SQLite file that is not there is refused before it is opened, so a mistyped
        path leaves no empty file behind.
        """
        if not self._owns_engine:
            yield
            return
        if self._unseen_file is not None:
            if not self._unseen_file.is_file():
                raise self._not_set_up(f"there is no file {self._unseen_file}")
            self._unseen_file = None
        try:
            yield
        except StoreUnavailable as error:
            if error.code == "schema_missing":
                raise self._not_set_up("its database has no rate bucket table") from error
            raise StoreUnavailable(
                f"the rate store {self.description} cannot be used: "
                f"{error.message.replace('the ledger database', 'its database')}",
                code="rate_store_unavailable") from error

    def _not_set_up(self, why: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"the rate store {self.description} is not set up ({why}); create it with "
            f"'quotagate init --db {self.description}'; nothing was changed",
            code="rate_store_schema_missing")

    def configure(self, key: BucketKey, config: BucketConfig, *, fresh: bool) -> float:
        with self._own_errors():
            return self._configure(key, config, fresh=fresh)

    def _configure(self, key: BucketKey, config: BucketConfig, *, fresh: bool) -> float:
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
        with self._own_errors():
            return self._take(key, amount)

    def _take(self, key: BucketKey, amount: int) -> Decision:
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
        with self._own_errors():
            tokens = run_transaction(
                self.engine, lambda connection: rate_buckets.add_in(connection, key.name, amount))
        if tokens is None:
            raise NotFound(f"rate bucket {key} is not configured in {self.description}",
                           code="unknown_rate_bucket")
        return tokens

    def peek(self, key: BucketKey, config: BucketConfig) -> float:
        with self._own_errors(), reading(self.engine) as connection:
            current = rate_buckets.read(connection, key.name)
        if current is None:
            raise NotFound(f"rate bucket {key} is not configured in {self.description}",
                           code="unknown_rate_bucket")
        return current[1]

    def forget(self, key: BucketKey) -> None:
        with self._own_errors():
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
