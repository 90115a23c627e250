"""A tenant's stream settings row (``qg_tenant_stream``), read apart from the streams.

``tenant show`` prints these settings and nothing else of streams: reading them here, the
facade builds no ``Streams`` (and imports none of its producers, consumers or Redis
scripts) for it (docs/decisions/241, 243). The streams' own changes of the row are in
``quotagate.store.topics`` (run by ``quotagate.streams.topics``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from quotagate.domain.model import validate_name
from quotagate.errors import NotFound, quoted
from quotagate.store import schema

__all__ = ["StreamSettings", "read"]


@dataclass(frozen=True)
class StreamSettings:
    """A tenant's stream settings; None means no cap (or: the shared Redis)."""

    tenant: str
    max_len: int | None = None
    max_in_flight: int | None = None
    redis_url: str | None = None


def read(connection: sa.Connection, tenant: str, *, lock: bool = False) -> StreamSettings:
    """The settings of an existing tenant (its defaults if it never set any).

    With ``lock`` the tenant's row is locked: that serialises a tenant's topic changes
    against a change of its caps."""
    validate_name(tenant, "tenant")
    query = sa.select(schema.tenant.c.name).where(schema.tenant.c.name == tenant)
    if lock:
        query = query.with_for_update()
    if connection.execute(query).first() is None:
        raise NotFound(f"tenant {quoted(tenant)} does not exist; create it with "
                       "'quotagate tenant set'", code="unknown_tenant")
    row = connection.execute(sa.select(schema.tenant_stream).where(
        schema.tenant_stream.c.tenant == tenant)).first()
    if row is None:
        return StreamSettings(tenant)
    return StreamSettings(tenant, row.max_len, row.max_in_flight, row.redis_url)
