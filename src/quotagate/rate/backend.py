"""The port every rate store implements (``rate.stores`` picks one by URL).

Stores only keep and decide token state; which tenants have a bucket, and its
shape, is durable configuration in the ledger database (``qg_rate_bucket``),
handed to the store with each call. A store that loses its state (a Redis
restart without persistence) therefore still knows the shape and restarts
the bucket empty rather than full: it may under-grant, never over-grant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from quotagate.domain.bucket import BucketConfig, Decision
from quotagate.rate.keys import BucketKey


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
