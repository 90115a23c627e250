"""Helpers for the stream tests: a gate with a stream Redis, unique tenants, key listings."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from quotagate import Quotagate
from support.databases import REDIS_URL, unavailable


def shared_redis_url() -> str:
    """The machine's Redis (never flushed by these tests: every test has its own tenants)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        unavailable("Redis", error)
    finally:
        client.close()
    return REDIS_URL


def new_tenant(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@contextmanager
def stream_gate(db_url: str, redis_url: str, **options: Any) -> Iterator[Quotagate]:
    with Quotagate.connect(db_url, redis=redis_url, **options) as gate:
        yield gate


def tenant_with_quota(gate: Quotagate, partitions: int = 8, parallelism: int = 8,
                      prefix: str = "t") -> str:
    tenant = new_tenant(prefix)
    gate.set_tenant(tenant, {"partitions": partitions, "parallelism": parallelism})
    return tenant


def keys_of(client: Any, pattern: str) -> list[str]:
    return sorted(name.decode() for name in client.scan_iter(match=pattern, count=1000))
