"""Per-tenant rate quotas: shape in the ledger database, tokens in the rate store.

Which tenants have a bucket, and its capacity and refill, is configuration:
it lives in ``qg_rate_bucket`` in the ledger database, changes with an audit
entry, and survives any rate store. The tokens live in the rate store. When
that store *is* the ledger database (the default), the row is both, and the
submit path takes its token in the submission's own transaction: the token
and the ``waiting`` row commit together or not at all.

With Redis the take is a separate atomic step *before* the submission's
transaction, with no ledger transaction open (a silent Redis holds no SQLite
write lock and no row lock). A submission that fails after its token was taken gets the token
back (:meth:`RateQuotas.refund`); a process killed between the take and the
commit loses that one token — the store under-grants, it never over-grants.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import BucketConfig, Decision, validate_amount
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.rate_refusal import format_tokens
from quotagate.errors import Conflict, NotFound, QuotagateError, quoted
from quotagate.rate.backend import RateStore
from quotagate.rate.keys import BucketKey
from quotagate.rate.sql import SqlRateStore
from quotagate.store import rate_buckets
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import reading, run_transaction

logger = logging.getLogger(__name__)


class RateQuotas:
    """Configure, top up and inspect buckets; the ledger's rate gate at submission."""

    def __init__(self, engine: Engine, store: RateStore, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self._in_transaction = isinstance(store, SqlRateStore) and store.shares(engine)

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    # -- configuration -----------------------------------------------------------

    def set(
        self, tenant: str, config: BucketConfig | None, *, topic: str | None = None,
        actor: str = "admin",
    ) -> dict[str, Any] | None:
        """Give ``tenant`` (or its ``topic``) a bucket, reshape it, or remove it (None).

        With a store outside the ledger database, the store is told with no ledger
        transaction open (as for takes, docs/decisions/111): before the row is
        written when a bucket is shaped — the row, the durable shape, follows — and
        after it is deleted when a bucket is removed. A store left behind by a
        failure holds only tokens of a bucket whose row says otherwise, which the
        next shaping overwrites.
        """
        key = BucketKey(tenant, topic)
        outside = not self._in_transaction

        def work(connection: sa.Connection, told: _Told) -> dict[str, Any] | None:
            _require_tenant(connection, tenant)
            existing = rate_buckets.read_config(connection, key.name)
            if outside and told.fresh is not None and told.fresh != (existing is None):
                raise _Changed  # created or removed since the store was told: again
            if config is None:
                told.removed = existing is not None
                if existing is not None:
                    rate_buckets.forget_in(connection, key.name)
                self._audit(connection, actor, "rate.set", key, "none")
                return None
            # The row is the durable shape; with the ledger as the store, also the tokens.
            tokens = rate_buckets.configure_in(connection, key.name, key.tenant, config,
                                               fresh=existing is None)
            if outside:
                assert told.tokens is not None  # configured before this transaction
                tokens = told.tokens
            self._audit(connection, actor, "rate.set", key,
                        f"capacity={format_tokens(config.capacity)},"
                        f"refill_per_second={config.refill_per_second:g}")
            return self._describe(key, config, tokens)

        for _ in range(3):
            told = _Told()
            if outside and config is not None:
                with reading(self.engine) as connection:
                    _require_tenant(connection, tenant)
                    told.fresh = rate_buckets.read_config(connection, key.name) is None
                told.tokens = self.store.configure(key, config, fresh=told.fresh)
            try:
                described = run_transaction(self.engine, functools.partial(work, told=told))
            except (IntegrityError, _Changed):
                continue  # configured concurrently by another admin: run again
            if outside and told.removed:
                self._forget_outside(key)
            return described
        raise Conflict(f"rate quota of {key} is being changed concurrently; retry")

    def check_usable(self, tenant: str, config: BucketConfig) -> None:
        """Raise the store's own error if it cannot answer for ``tenant``'s bucket now,
        changing nothing. A tenant change that also shapes its bucket asks first: the
        tenant is written before its bucket can be (the bucket needs the tenant's row), so
        a store that is down would otherwise leave a tenant meant to be limited unlimited."""
        if self._in_transaction:
            return  # the ledger's own database: the shaping fails or succeeds with it
        # NotFound: the store answered, and holds nothing for this bucket yet.
        with contextlib.suppress(NotFound):
            self.store.peek(BucketKey(tenant), config)

    def _forget_outside(self, key: BucketKey) -> None:
        try:
            self.store.forget(key)
        except QuotagateError as error:
            # The row is gone, so nothing takes from this state any more, and a new
            # bucket of the same key starts from its own configure. The error's own
            # sentence says why; a traceback under a removal that succeeded read as a failure.
            logger.warning("the rate bucket %s was removed; its tokens stay in %s until it "
                           "is shaped again (%s)", key, self.store.description, error)

    def add(
        self, tenant: str, amount: int, *, topic: str | None = None, actor: str = "admin"
    ) -> dict[str, Any]:
        """Top up ``tenant``'s bucket by ``amount`` tokens (never above its capacity)."""
        validate_amount(amount, "top-up")
        key = BucketKey(tenant, topic)
        if self._in_transaction:
            def work(connection: sa.Connection) -> dict[str, Any]:
                config = self._config_or_raise(connection, key)
                tokens = rate_buckets.add_in(connection, key.name, amount)
                assert tokens is not None  # the row was there a statement ago, in this transaction
                self._audit(connection, actor, "tokens.add", key,
                            f"+{amount}, {format_tokens(tokens)} left")
                return self._describe(key, config, tokens)

            return run_transaction(self.engine, work)
        with reading(self.engine) as connection:
            config = self._config_or_raise(connection, key)
        # Not in a transaction with the audit entry: a rerun transaction must not add twice.
        tokens = self.store.add(key, config, amount)
        run_transaction(self.engine, lambda connection: self._audit(
            connection, actor, "tokens.add", key, f"+{amount}, {format_tokens(tokens)} left"))
        return self._describe(key, config, tokens)

    def status(self, tenant: str, *, topic: str | None = None) -> dict[str, Any] | None:
        """Shape and tokens left of ``tenant``'s bucket; None if it has none."""
        key = BucketKey(tenant, topic)
        with reading(self.engine) as connection:
            _require_tenant(connection, tenant)
            current = rate_buckets.read(connection, key.name)
        if current is None:
            return None
        config, tokens = current
        if not self._in_transaction:
            tokens = self.store.peek(key, config)
        return self._describe(key, config, tokens)

    # -- the gate ------------------------------------------------------------------

    def take_for_submission(
        self, connection: sa.Connection, tenant: str, amount: int = 1
    ) -> Decision:
        """In the submission's transaction; only for the ledger database as the store."""
        if not self._in_transaction:
            raise AssertionError("a store outside the ledger database is taken from outside "
                                 "the transaction (take_outside)")
        return (rate_buckets.take_in(connection, BucketKey(tenant).name, amount)
                or Decision.unlimited())

    def take_outside(self, tenant: str, amount: int = 1) -> Decision:
        key = BucketKey(tenant)
        with reading(self.engine) as connection:
            config = rate_buckets.read_config(connection, key.name)
        # The connection is back in the pool: a silent store holds nothing of the ledger's.
        if config is None:
            return Decision.unlimited()
        return self.store.take(key, config, amount)

    def refund(self, tenant: str, amount: int = 1) -> None:
        if self._in_transaction:
            return  # rolled back with the transaction
        key = BucketKey(tenant)
        try:
            with reading(self.engine) as connection:
                config = rate_buckets.read_config(connection, key.name)
            if config is not None:
                self.store.add(key, config, amount)
        except (QuotagateError, sa.exc.SQLAlchemyError):
            # The submission's own error is what the caller must see; the token is lost.
            logger.warning("could not give back %d token(s) to %s", amount, key, exc_info=True)

    # -- helpers -------------------------------------------------------------------

    def _describe(self, key: BucketKey, config: BucketConfig, tokens: float) -> dict[str, Any]:
        return {
            "key": key.name,
            "tenant": key.tenant,
            "topic": key.topic,
            "capacity": int(config.capacity),
            "refill_per_second": config.refill_per_second,
            "tokens": tokens,
            "store": self.store.description,
        }

    @staticmethod
    def _config_or_raise(connection: sa.Connection, key: BucketKey) -> BucketConfig:
        _require_tenant(connection, key.tenant)
        config = rate_buckets.read_config(connection, key.name)
        if config is None:
            raise NotFound(
                f"{key} has no rate quota to top up; set one with "
                f"'quotagate tenant set {key.tenant} --rate capacity=N,refill=R'",
                code="no_rate_quota",
            )
        return config

    def _audit(
        self, connection: sa.Connection, actor: str, operation: str, key: BucketKey, change: str
    ) -> None:
        record(connection, self.clock.now(),
               AuditEntry(actor, operation, "ok", key.tenant, f"rate/{key.name}", change))


class _Changed(Exception):
    """The bucket was created or removed concurrently after the store was told."""


@dataclass
class _Told:
    """What the outside store was told before the configuration transaction."""

    fresh: bool | None = None  # the bucket was new when the store was configured
    tokens: float | None = None  # the tokens the store holds after it
    removed: bool = False  # the transaction removed the bucket: forget it after


def _require_tenant(connection: sa.Connection, tenant: str) -> None:
    if not rate_buckets.tenant_exists(connection, tenant):
        raise NotFound(
            f"tenant {quoted(tenant)} does not exist; create it with 'quotagate tenant set'",
            code="unknown_tenant",
        )
