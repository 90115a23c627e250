"""The topic rows (``qg_topic``) and the writes of a tenant's stream settings row.

The statements of ``quotagate.streams.topics``, which orchestrates them: it
charges the tenant's quota, writes these rows and their audit entry, and tells
Redis, in one transaction. Each function runs inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from quotagate.store import schema
from quotagate.store.rows import holder_usage
from quotagate.store.stream_settings import StreamSettings

__all__ = [
    "TopicRow", "all_settings", "delete", "exists", "insert", "names", "read", "rows",
    "tenant_usage", "write_settings",
]

_topic, _settings = schema.topic, schema.tenant_stream


@dataclass(frozen=True)
class TopicRow:
    """A topic as stored: the caller makes its spec of it (and checks it there)."""

    tenant: str
    name: str
    partitions: int
    parallelism: int
    max_len: int | None
    created: float


def _row(row: Any) -> TopicRow:
    return TopicRow(row.tenant, row.name, int(row.partitions), int(row.parallelism),
                    None if row.max_len is None else int(row.max_len), float(row.created))


def _one(tenant: str, name: str) -> sa.ColumnElement[bool]:
    return sa.and_(_topic.c.tenant == tenant, _topic.c.name == name)


def exists(connection: sa.Connection, tenant: str, name: str) -> bool:
    return connection.execute(
        sa.select(_topic.c.name).where(_one(tenant, name))).first() is not None


def insert(connection: sa.Connection, topic: TopicRow) -> None:
    connection.execute(_topic.insert().values(
        tenant=topic.tenant, name=topic.name, partitions=topic.partitions,
        parallelism=topic.parallelism, max_len=topic.max_len, created=topic.created))


def read(connection: sa.Connection, tenant: str, name: str, *,
         lock: bool = False) -> TopicRow | None:
    """The topic, or None; with ``lock`` its row stays locked until the transaction ends."""
    query = sa.select(_topic).where(_one(tenant, name))
    if lock:
        query = query.with_for_update()
    row = connection.execute(query).first()
    return None if row is None else _row(row)


def delete(connection: sa.Connection, tenant: str, name: str) -> bool:
    """Delete the topic's row; False if it was not there."""
    return connection.execute(_topic.delete().where(_one(tenant, name))).rowcount == 1


def rows(connection: sa.Connection, tenant: str | None = None) -> list[TopicRow]:
    """Every topic (of ``tenant``), by tenant and name."""
    query = sa.select(_topic).order_by(_topic.c.tenant, _topic.c.name)
    if tenant is not None:
        query = query.where(_topic.c.tenant == tenant)
    return [_row(row) for row in connection.execute(query)]


def names(connection: sa.Connection, tenant: str, limit: int) -> Sequence[str]:
    """The first ``limit`` names of the tenant's topics, in order."""
    return connection.execute(
        sa.select(_topic.c.name).where(_topic.c.tenant == tenant)
        .order_by(_topic.c.name).limit(limit)).scalars().all()


def tenant_usage(connection: sa.Connection, tenant: str) -> dict[str, tuple[int, int]]:
    """``resource -> (used, cap)`` of the tenant's quota rows (a refusal's explanation)."""
    return holder_usage(connection, schema.tenant_quota, "tenant", tenant)


def all_settings(connection: sa.Connection) -> list[StreamSettings]:
    """Every tenant's stream settings row (tenants that never set any have none)."""
    return [StreamSettings(row.tenant, row.max_len, row.max_in_flight, row.redis_url)
            for row in connection.execute(sa.select(_settings)).all()]


def write_settings(connection: sa.Connection, tenant: str, changes: Mapping[str, Any]) -> None:
    """Change the given columns of the tenant's settings row, creating it if it has none.

    Two first writes at once: one INSERT fails (IntegrityError); the caller reruns.
    """
    updated = connection.execute(
        _settings.update().where(_settings.c.tenant == tenant).values(**changes))
    if updated.rowcount == 0:
        connection.execute(_settings.insert().values(tenant=tenant, **changes))
