"""The admission hot path's statements, built once and reused with bound parameters.

Building a SQLAlchemy expression costs more CPU than sending it to a nearby
database (about 1.5 ms per admission when rebuilt every time, measured by
benchmarks/admit.py). Each statement here depends only on the *shape* of its
input (how many tenants, which resources, how many requests), so it is cached
by that shape and filled in with parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import RequestState
from quotagate.store import schema

_WAITING = RequestState.WAITING.value


@lru_cache(maxsize=1)
def usage_query() -> sa.CompoundSelect[Any]:
    """Tenant and pool usage in one round trip."""
    quota, capacity = schema.tenant_quota, schema.pool_capacity
    return sa.union_all(
        sa.select(sa.literal("t").label("kind"), quota.c.tenant.label("holder"), quota.c.resource,
                  quota.c.used, quota.c.cap),
        sa.select(sa.literal("p").label("kind"), capacity.c.pool.label("holder"),
                  capacity.c.resource, capacity.c.used, capacity.c.cap),
    )


@lru_cache(maxsize=256)
def head_query(tenant_count: int, window: int) -> sa.Select[Any] | sa.CompoundSelect[Any]:
    """The first ``window`` waiting requests of each of ``tenant_count`` tenants.

    One bounded index range scan per tenant; parameters ``tenant_0`` … ``tenant_N``.
    """
    request = schema.request
    heads = [
        sa.select(
            request.c.id, request.c.tenant, request.c.cost, request.c.queue_key,
            request.c.created, request.c.target,
        )
        .where(request.c.tenant == sa.bindparam(f"tenant_{index}"), request.c.state == _WAITING)
        .order_by(request.c.queue_key, request.c.created, request.c.id)
        .limit(window)
        .subquery(f"head_{index}")
        for index in range(tenant_count)
    ]
    if len(heads) == 1:
        return sa.select(heads[0])
    return sa.union_all(*(sa.select(head) for head in heads))


def head_parameters(tenants: Sequence[str]) -> dict[str, str]:
    """The values of :func:`head_query`'s ``tenant_i`` parameters."""
    return {f"tenant_{index}": tenant for index, tenant in enumerate(tenants)}


@lru_cache(maxsize=1)
def lock_waiting_query() -> sa.Select[Any]:
    """Lock the given waiting requests, skipping those another transaction holds."""
    request = schema.request
    return (
        sa.select(request.c.id)
        .where(request.c.id.in_(sa.bindparam("ids", expanding=True)), request.c.state == _WAITING)
        .order_by(request.c.id)
        .with_for_update(skip_locked=True)
    )


@lru_cache(maxsize=64)
def reserve_statement(count: int) -> sa.Update:
    """Set ``count`` waiting requests reserved, each with its pool (``id_i`` → ``pool_i``)."""
    request = schema.request
    pool_of = sa.case(
        *((request.c.id == sa.bindparam(f"id_{i}"), sa.bindparam(f"pool_{i}")) for i in range(count)),
    )
    return (
        request.update()
        .where(request.c.id.in_(sa.bindparam("ids", expanding=True)), request.c.state == _WAITING)
        .values(state=RequestState.RESERVED.value, pool=pool_of, updated=sa.bindparam("now"))
    )


@lru_cache(maxsize=256)
def adjust_statement(table: sa.Table, holder_column: str, resources: tuple[str, ...],
                     charge: bool) -> sa.Update:
    """Charge or return amounts on one holder's rows (``holder``, ``amount_i`` per resource).

    A charge only applies where ``used + amount <= cap`` and a return only
    where ``used >= amount``; the caller checks that one row per resource changed.
    """
    amount = sa.case(
        *((table.c.resource == resource, sa.bindparam(f"amount_{i}", type_=sa.BigInteger))
          for i, resource in enumerate(resources)),
    )
    condition = table.c.used + amount <= table.c.cap if charge else table.c.used >= amount
    return (
        table.update()
        .where(table.c[holder_column] == sa.bindparam("holder"),
               table.c.resource.in_(resources), condition)
        .values(used=table.c.used + amount if charge else table.c.used - amount)
    )


@lru_cache(maxsize=16)
def submission_facts_query(with_target: bool) -> sa.CompoundSelect[Any]:
    """Everything submit must know before it writes, in one round trip.

    Rows ``(fact, value)``: ``request`` if the id exists, ``tenant`` if the
    tenant exists, one ``resource`` per cost resource some pool offers,
    ``target`` if the named target exists and serves the tenant,
    ``default_closed`` if no target is named and the default target serves only
    other tenants, ``bucket`` if the tenant has a rate quota. Parameters: ``id``,
    ``tenant``, ``resources`` (a list), ``target``.
    """
    request, capacity = schema.request, schema.pool_capacity
    parts = [
        sa.select(sa.literal("request").label("fact"), request.c.id.label("value"))
        .where(request.c.id == sa.bindparam("id")),
        sa.select(sa.literal("tenant").label("fact"), schema.tenant.c.name.label("value"))
        .where(schema.tenant.c.name == sa.bindparam("tenant")),
        sa.select(sa.literal("resource").label("fact"), capacity.c.resource.label("value"))
        .where(capacity.c.resource.in_(sa.bindparam("resources", expanding=True)))
        .distinct(),
        sa.select(sa.literal("bucket").label("fact"), schema.rate_bucket.c.key.label("value"))
        .where(schema.rate_bucket.c.key == sa.bindparam("tenant")),
    ]
    target, allowed = schema.delivery_target, schema.target_tenant
    limited = sa.exists().where(allowed.c.target == target.c.name)
    admitted = sa.exists().where(allowed.c.target == target.c.name,
                                 allowed.c.tenant == sa.bindparam("tenant"))
    if with_target:
        # A target limited to other tenants is, to this tenant, a target that
        # does not exist (docs/decisions/311-target-tenants.md).
        parts.append(
            sa.select(sa.literal("target").label("fact"), target.c.name.label("value"))
            .where(target.c.name == sa.bindparam("target"), sa.or_(~limited, admitted))
        )
    else:
        parts.append(
            sa.select(sa.literal("default_closed").label("fact"), target.c.name.label("value"))
            .where(target.c.is_default == sa.true(), limited, ~admitted)
        )
    return sa.union_all(*parts)
