"""The port every rate store implements, and the registry that picks one by URL.

Stores only keep and decide token state; which tenants have a bucket, and its
shape, is durable configuration in the ledger database (``qg_rate_bucket``),
handed to the store with each call. A store that loses its state (a Redis
restart without persistence) therefore still knows the shape and restarts
the bucket empty rather than full: it may under-grant, never over-grant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import make_url
from sqlalchemy.exc import ArgumentError

from quotagate.domain.bucket import BucketConfig, Decision
from quotagate.errors import InvalidInput
from quotagate.rate.keys import BucketKey

ENVIRONMENT_VARIABLE = "QUOTAGATE_RATE_STORE"


@dataclass(frozen=True)
class Take:
    """One take in a batch: ``amount`` tokens from ``key``, shaped by ``config``."""

    key: BucketKey
    config: BucketConfig
    amount: int = 1


@runtime_checkable
class RateStore(Protocol):
    """Token state for many buckets; every method decides atomically in the store."""

    @property
    def description(self) -> str:
        """Where the state lives, safe to print (no password)."""
        ...

    def configure(self, key: BucketKey, config: BucketConfig, *, fresh: bool) -> float:
        """Give ``key`` the shape ``config``; return the tokens it holds now.

        ``fresh``: a new bucket, which starts full. Otherwise the current tokens
        are kept (refilled at the old rate until now, then capped at the new capacity).
        """
        ...

    def take(self, key: BucketKey, config: BucketConfig, amount: int = 1) -> Decision:
        """Take ``amount`` tokens, all or none."""
        ...

    def take_many(self, takes: Sequence[Take]) -> list[Decision]:
        """Decide several takes, each all or none, in as few round trips as the store allows."""
        ...

    def add(self, key: BucketKey, config: BucketConfig, amount: int) -> float:
        """Top up by ``amount`` (never above capacity); return the tokens held now."""
        ...

    def peek(self, key: BucketKey, config: BucketConfig) -> float:
        """The tokens held now, changing nothing."""
        ...

    def forget(self, key: BucketKey) -> None:
        """Drop the bucket's state."""
        ...

    def close(self) -> None: ...


StoreFactory = Callable[[str, Engine | None], RateStore]
_REGISTRY: dict[str, StoreFactory] = {}


def register(*schemes: str) -> Callable[[StoreFactory], StoreFactory]:
    """Map URL schemes to a store factory (``factory(url, ledger_engine)``)."""

    def decorator(factory: StoreFactory) -> StoreFactory:
        for scheme in schemes:
            _REGISTRY[scheme] = factory
        return factory

    return decorator


def rate_store_from_url(url: str | None, ledger_engine: Engine | None = None) -> RateStore:
    """The store named by ``url``; without one, the ledger database itself.

    ``sqlite:///…``, ``postgresql://…``, ``mysql://…`` keep buckets in that SQL
    database (the ledger's own, when it is the same URL, so a take commits with
    the submission); ``redis://…``, ``rediss://…``, ``unix://…`` keep them in Redis.
    """
    _load_builtin_stores()
    if not url:
        if ledger_engine is None:
            raise InvalidInput("a rate store URL is needed without a ledger database",
                               code="invalid_rate_store_url")
        url = ledger_engine.url.render_as_string(hide_password=False)
    try:
        scheme = make_url(url).drivername.partition("+")[0]
    except ArgumentError:
        scheme = url.partition("://")[0] if "://" in url else ""
    factory = _REGISTRY.get(scheme)
    if factory is None:
        raise InvalidInput(
            f"rate store URL scheme {scheme or url!r} is not supported; use one of "
            f"{', '.join(sorted(_REGISTRY))}",
            code="invalid_rate_store_url",
        )
    return factory(url, ledger_engine)


def _load_builtin_stores() -> None:
    # Importing registers them; redis itself is imported only when a redis URL is used.
    from quotagate.rate import redis, sql  # noqa: F401
