"""Topics on the ledger side: specs per tenant, quotas charged where the ledger is authoritative.

A topic's ``partitions`` and ``parallelism`` are tenant quota resources
(``qg_tenant_quota``), charged with the same conditional UPDATE admission
uses (``store.cohorts.adjust_tenant``), in one transaction with the topic row and
its audit entry. There is no second counter store in Redis that could drift
from the ledger, and ``quotagate check`` counts topics with requests.

Redis is written only from inside that transaction, as its last step
(``on_created``): over quota, the transaction stops before it and Redis is
never touched; if Redis fails, the transaction rolls back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.domain.bucket import BucketConfig
from quotagate.domain.clock import Clock, SystemClock
from quotagate.domain.model import validate_name
from quotagate.errors import Conflict, InvalidInput, NotFound, quoted
from quotagate.rate.keys import BucketKey
from quotagate.rate.quotas import RateQuotas
from quotagate.store import rate_buckets, stream_settings
from quotagate.store import topics as topic_rows
from quotagate.store.audit import AuditEntry, record
from quotagate.store.cohorts import adjust_tenant
from quotagate.store.dialect import reading, run_transaction
from quotagate.store.stream_settings import StreamSettings
from quotagate.streams.keys import validate_part

PARTITIONS = "partitions"
PARALLELISM = "parallelism"
MAX_PARTITIONS = 1024
MAX_LEN = 10**12


@dataclass(frozen=True)
class TopicSpec:
    tenant: str
    name: str
    partitions: int
    parallelism: int
    max_len: int | None = None
    created: float = 0.0

    def __post_init__(self) -> None:
        validate_name(self.tenant, "tenant")
        validate_part(self.name, "topic")
        for value, what in ((self.partitions, PARTITIONS), (self.parallelism, PARALLELISM)):
            _whole(value, what, 1, MAX_PARTITIONS)
        if self.max_len is not None:
            _whole(self.max_len, "max length", 1, MAX_LEN)

    @property
    def cost(self) -> dict[str, int]:
        return {PARTITIONS: self.partitions, PARALLELISM: self.parallelism}

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "topic": self.name, "partitions": self.partitions,
                "parallelism": self.parallelism, "max_len": self.max_len,
                "created": self.created}


def _whole(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} must be a whole number from {low} to {high}, got {quoted(value)}",
                           code=f"invalid_{what.replace(' ', '_')}")
    return value


def _spec(row: topic_rows.TopicRow) -> TopicSpec:
    return TopicSpec(row.tenant, row.name, row.partitions, row.parallelism, row.max_len,
                     row.created)


# Sentinel: "leave this setting as it is".
KEEP: Any = object()

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://")


def stream_setting_changes(
    *, max_len: int | None = KEEP, max_in_flight: int | None = KEEP,
    redis_url: str | None = KEEP,
) -> dict[str, Any]:
    """The settings given, checked (None clears one): callers check before changing anything."""
    changes: dict[str, Any] = {}
    if max_len is not KEEP:
        changes["max_len"] = None if max_len is None else _whole(max_len, "max length", 1,
                                                                 MAX_LEN)
    if max_in_flight is not KEEP:
        changes["max_in_flight"] = None if max_in_flight is None else _whole(
            max_in_flight, "max in flight", 1, MAX_LEN)
    if redis_url is not KEEP:
        if redis_url is not None and (not isinstance(redis_url, str)
                                      or not redis_url.startswith(REDIS_SCHEMES)):
            raise InvalidInput("a tenant's Redis must be a redis://, rediss://, unix:// or "
                               "redis+cluster:// URL", code="invalid_redis_url")
        changes["redis_url"] = redis_url
    return changes


class Topics:
    """Create, delete and read topic specs and tenant stream settings (SQL only)."""

    def __init__(self, engine: Engine, rates: RateQuotas, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.rates = rates
        self.clock: Clock = clock or SystemClock()

    # -- topics ---------------------------------------------------------------------

    def create(
        self,
        tenant: str,
        name: str,
        *,
        partitions: int,
        parallelism: int,
        max_len: int | None = None,
        rate: BucketConfig | None = None,
        actor: str = "admin",
        on_created: Callable[[TopicSpec], None] | None = None,
    ) -> TopicSpec:
        """Charge the tenant and record the topic; refused over quota with nothing changed."""
        requested = TopicSpec(tenant, name, partitions, parallelism, max_len)

        def work(connection: sa.Connection) -> TopicSpec:
            settings = self._settings(connection, tenant, lock=True)
            if topic_rows.exists(connection, tenant, name):
                raise Conflict(f"topic {quoted(name)} of tenant {quoted(tenant)} exists already",
                               code="topic_exists")
            spec = self._capped(requested, settings)
            if not adjust_tenant(connection, tenant, spec.cost, charge=True):
                # Some resources may be charged in this transaction already: say what is
                # short from the committed rows, once it has rolled back.
                raise _OverQuota(spec)
            now = self.clock.now()
            spec = TopicSpec(tenant, name, partitions, parallelism, spec.max_len, now)
            topic_rows.insert(connection, topic_rows.TopicRow(
                tenant, name, partitions, parallelism, spec.max_len, now))
            if rate is not None:
                self._set_rate(connection, BucketKey(tenant, name), rate)
            record(connection, now, AuditEntry(
                actor, "topic.create", "ok", tenant, f"topic/{tenant}/{name}",
                f"partitions={partitions},parallelism={parallelism},max_len={spec.max_len}"))
            if on_created is not None:
                on_created(spec)  # last: Redis is written only once SQL has said yes
            return spec

        try:
            return run_transaction(self.engine, work)
        except _OverQuota as refused:
            with reading(self.engine) as connection:
                raise self._over_quota(connection, refused.spec) from None
        except IntegrityError as error:
            raise Conflict(f"topic {quoted(name)} of tenant {quoted(tenant)} is being created concurrently",
                           code="topic_exists") from error

    def delete(
        self, tenant: str, name: str, *, actor: str = "admin",
        on_deleted: Callable[[TopicSpec], None] | None = None,
    ) -> TopicSpec:
        """Remove the topic and return its quota, exactly once (a second delete: not found)."""
        validate_part(name, "topic")

        def work(connection: sa.Connection) -> TopicSpec:
            row = topic_rows.read(connection, tenant, name, lock=True)
            if row is None:
                raise _unknown(tenant, name)
            spec = _spec(row)
            if not topic_rows.delete(connection, tenant, name):
                raise _unknown(tenant, name)
            if not adjust_tenant(connection, tenant, spec.cost, charge=False):
                raise RuntimeError(f"ledger inconsistent: cannot return {spec.cost} to {tenant}")
            key = BucketKey(tenant, name)
            if rate_buckets.forget_in(connection, key.name) and not self.rates.in_transaction:
                self.rates.store.forget(key)
            record(connection, self.clock.now(), AuditEntry(
                actor, "topic.delete", "released", tenant, f"topic/{tenant}/{name}",
                f"partitions={spec.partitions},parallelism={spec.parallelism}"))
            if on_deleted is not None:
                on_deleted(spec)
            return spec

        return run_transaction(self.engine, work)

    def get(self, tenant: str, name: str) -> TopicSpec:
        validate_part(name, "topic")
        with reading(self.engine) as connection:
            row = topic_rows.read(connection, tenant, name)
        if row is None:
            raise _unknown(tenant, name)
        return _spec(row)

    def specs(self, tenant: str | None = None) -> list[TopicSpec]:
        with reading(self.engine) as connection:
            return [_spec(row) for row in topic_rows.rows(connection, tenant)]

    def rate_config(self, tenant: str, name: str) -> BucketConfig | None:
        with reading(self.engine) as connection:
            return rate_buckets.read_config(connection, BucketKey(tenant, name).name)

    # -- tenant settings --------------------------------------------------------------

    def settings(self, tenant: str) -> StreamSettings:
        with reading(self.engine) as connection:
            return self._settings(connection, tenant)

    def check_settings(
        self, tenant: str, *, max_len: int | None = KEEP, max_in_flight: int | None = KEEP,
        redis_url: str | None = KEEP,
    ) -> None:
        """Raise what :meth:`set_settings` would refuse for the tenant as it is now,
        writing nothing: a caller changing quotas as well checks first, so a refusal
        leaves the quotas untouched too."""
        changes = stream_setting_changes(max_len=max_len, max_in_flight=max_in_flight,
                                         redis_url=redis_url)
        with reading(self.engine) as connection:
            current = self._settings(connection, tenant)
            if "redis_url" in changes and changes["redis_url"] != current.redis_url:
                self._refuse_move(connection, tenant)

    def all_settings(self) -> list[StreamSettings]:
        with reading(self.engine) as connection:
            return topic_rows.all_settings(connection)

    def set_settings(
        self, tenant: str, *, max_len: int | None = KEEP, max_in_flight: int | None = KEEP,
        redis_url: str | None = KEEP, actor: str = "admin",
    ) -> StreamSettings:
        """Change the settings given (None clears one); the others stay as they are.

        A tenant's Redis cannot change while it has topics: their streams would stay
        behind in the old one while the ledger sent producers and consumers to the new.
        """
        changes = stream_setting_changes(max_len=max_len, max_in_flight=max_in_flight,
                                         redis_url=redis_url)

        def work(connection: sa.Connection) -> StreamSettings:
            current = self._settings(connection, tenant, lock=True)
            if "redis_url" in changes and changes["redis_url"] != current.redis_url:
                self._refuse_move(connection, tenant)
            if changes:
                topic_rows.write_settings(connection, tenant, changes)
            # The URL may hold a password: the audit entry names only which settings changed.
            described = ",".join(
                f"{key}={value}" if key != "redis_url" else f"redis_url={'set' if value else 'none'}"
                for key, value in sorted(changes.items()))
            record(connection, self.clock.now(), AuditEntry(
                actor, "tenant.stream.set", "ok", tenant, f"tenant/{tenant}", described))
            return self._settings(connection, tenant)

        for _ in range(3):
            try:
                return run_transaction(self.engine, work)
            except IntegrityError:
                continue  # inserted concurrently: run again as an update
        raise Conflict(f"stream settings of {quoted(tenant)} are being changed concurrently; retry")

    # -- helpers --------------------------------------------------------------------

    @staticmethod
    def _settings(connection: sa.Connection, tenant: str, *, lock: bool = False) -> StreamSettings:
        return stream_settings.read(connection, tenant, lock=lock)

    @staticmethod
    def _refuse_move(connection: sa.Connection, tenant: str) -> None:
        names = topic_rows.names(connection, tenant, 6)
        if names:
            shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
            raise Conflict(
                f"tenant {quoted(tenant)} has topics ({shown}) in its current Redis; delete them "
                "before mapping the tenant to another Redis (their streams would not move)",
                code="tenant_has_topics")

    @staticmethod
    def _capped(spec: TopicSpec, settings: StreamSettings) -> TopicSpec:
        """The tenant's length cap bounds the topic's: a spec asking more is refused."""
        cap = settings.max_len
        if cap is None:
            return spec
        if spec.max_len is None:
            return TopicSpec(spec.tenant, spec.name, spec.partitions, spec.parallelism, cap)
        if spec.max_len > cap:
            raise InvalidInput(
                f"topic max length {spec.max_len} is above the stream length limit {cap} of "
                f"tenant {quoted(spec.tenant)} ('quotagate tenant set {spec.tenant} "
                "--stream-max-len')",
                code="max_len_above_limit")
        return spec

    @staticmethod
    def _over_quota(connection: sa.Connection, spec: TopicSpec) -> Conflict:
        usage = topic_rows.tenant_usage(connection, spec.tenant)
        short: list[str] = []
        for resource, amount in sorted(spec.cost.items()):
            if resource not in usage:
                short.append(f"{resource}: no quota (set one with 'quotagate tenant set "
                             f"{spec.tenant} --quota {resource}=N')")
                continue
            used, cap = usage[resource]
            if used + amount > cap:
                short.append(f"{resource} needs {amount}, {cap - used} of {cap} left")
        if not short:  # it fitted when read again: the rows changed meanwhile
            short.append("the tenant's use changed meanwhile; try again")
        return Conflict(f"topic {quoted(spec.name)} does not fit the quota of tenant "
                        f"{quoted(spec.tenant)}: "
                        + "; ".join(short) + "; nothing was created",
                        code="topic_quota_exceeded")

    def _set_rate(self, connection: sa.Connection, key: BucketKey, config: BucketConfig) -> None:
        existing = rate_buckets.read_config(connection, key.name)
        rate_buckets.configure_in(connection, key.name, key.tenant, config,
                                  fresh=existing is None)
        if not self.rates.in_transaction:
            self.rates.store.configure(key, config, fresh=existing is None)


class _OverQuota(Exception):
    """Raised inside the create transaction to roll it back; the caller explains it."""

    def __init__(self, spec: TopicSpec) -> None:
        super().__init__(spec.name)
        self.spec = spec


def _unknown(tenant: str, name: str) -> NotFound:
    return NotFound(f"topic {quoted(name)} of tenant {quoted(tenant)} does not exist", code="unknown_topic")
