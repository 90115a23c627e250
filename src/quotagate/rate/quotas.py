"""Per-tenant rate quotas: shape in the ledger database, tokens in the rate store.

Which tenants have a bucket, and its capacity and refill, is configuration:
it lives in ``qg_rate_bucket`` in the ledger database, changes with an audit
entry, and survives any rate store. The tokens live in the rate store. When
that store *is* the ledger database (the default), the row is both, and the
submit path takes its token in the submission's own transaction: the token
and the ``waiting`` row commit together or not at all.

With Redis the take is a separate atomic step *before* the submission
commits. A submission that fails after its token was taken gets the token
back (:meth:`RateQuotas.refund`); a process killed between the take and the
commit loses that one token — the store under-grants, it never over-grants.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import BucketConfig, Decision, validate_amount
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.rate_refusal import format_tokens
from quotagate.errors import Conflict, NotFound, QuotagateError
from quotagate.rate import sql
from quotagate.rate.backend import RateStore
from quotagate.rate.keys import BucketKey
from quotagate.store import schema
from quotagate.store.audit import AuditEntry, record
from quotagate.store.dialect import reading, run_transaction

logger = logging.getLogger(__name__)


class RateQuotas:
    """Configure, top up and inspect buckets; the ledger's rate gate at submission."""

    def __init__(self, engine: Engine, store: RateStore, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self._in_transaction = isinstance(store, sql.SqlRateStore) and store.shares(engine)

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    # -- configuration -----------------------------------------------------------

    def set(
        self, tenant: str, config: BucketConfig | None, *, topic: str | None = None,
        actor: str = "admin",
    ) -> dict[str, Any] | None:
        """Give ``tenant`` (or its ``topic``) a bucket, reshape it, or remove it (None)."""
        key = BucketKey(tenant, topic)

        def work(connection: sa.Connection) -> dict[str, Any] | None:
            _require_tenant(connection, tenant)
            existing = sql.read_config(connection, key)
            if config is None:
                if existing is not None:
                    sql.forget_in(connection, key)
                    if not self._in_transaction:
                        self.store.forget(key)
                self._audit(connection, actor, "rate.set", key, "none")
                return None
            # The row is the durable shape; with the ledger as the store, also the tokens.
            tokens = sql.configure_in(connection, key, config, fresh=existing is None)
            if not self._in_transaction:
                tokens = self.store.configure(key, config, fresh=existing is None)
            self._audit(connection, actor, "rate.set", key,
                        f"capacity={format_tokens(config.capacity)},"
                        f"refill_per_second={config.refill_per_second:g}")
            return self._describe(key, config, tokens)

        for _ in range(3):
            try:
                return run_transaction(self.engine, work)
            except IntegrityError:
                continue  # configured concurrently by another admin: run again as a reshape
        raise Conflict(f"rate quota of {key} is being changed concurrently; retry")

    def add(
        self, tenant: str, amount: int, *, topic: str | None = None, actor: str = "admin"
    ) -> dict[str, Any]:
        """Top up ``tenant``'s bucket by ``amount`` tokens (never above its capacity)."""
        validate_amount(amount, "top-up")
        key = BucketKey(tenant, topic)
        if self._in_transaction:
            def work(connection: sa.Connection) -> dict[str, Any]:
                config = self._config_or_raise(connection, key)
                tokens = sql.add_in(connection, key, amount)
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
            current = sql.read(connection, key)
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
        key = BucketKey(tenant)
        if self._in_transaction:
            return sql.take_in(connection, key, amount) or Decision.unlimited()
        config = sql.read_config(connection, key)
        if config is None:
            return Decision.unlimited()
        return self.store.take(key, config, amount)

    def refund(self, tenant: str, amount: int = 1) -> None:
        if self._in_transaction:
            return  # rolled back with the transaction
        key = BucketKey(tenant)
        try:
            with reading(self.engine) as connection:
                config = sql.read_config(connection, key)
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
        config = sql.read_config(connection, key)
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


def _require_tenant(connection: sa.Connection, tenant: str) -> None:
    if connection.execute(
        sa.select(schema.tenant.c.name).where(schema.tenant.c.name == tenant)
    ).first() is None:
        raise NotFound(
            f"tenant {tenant!r} does not exist; create it with 'quotagate tenant set'",
            code="unknown_tenant",
        )
