"""Conversions between table rows and domain objects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import Cost, Request, RequestState
from quotagate.store import schema, statements


def encode_cost(cost: Cost) -> str:
    return json.dumps(dict(sorted(cost.items())), separators=(",", ":"))


def decode_cost(text: str) -> Cost:
    decoded: dict[str, int] = json.loads(text)
    return decoded


def request_from_row(row: Mapping[Any, Any]) -> Request:
    return Request(
        id=row["id"],
        tenant=row["tenant"],
        state=RequestState(row["state"]),
        cost=decode_cost(row["cost"]),
        priority=row["priority"],
        payload=json.loads(row["payload"]),
        created=row["created"],
        pool=row["pool"],
        target=row["target"],
        reason=row["reason"],
        updated=row["updated"],
    )


def usage_by_holder(
    connection: sa.Connection, table: sa.Table, holder_column: str
) -> dict[str, dict[str, tuple[int, int]]]:
    """``{holder: {resource: (used, cap)}}`` for every row of a quota/capacity table."""
    usage: dict[str, dict[str, tuple[int, int]]] = {}
    holder = table.c[holder_column]
    query = sa.select(holder, table.c.resource, table.c.used, table.c.cap).order_by(
        holder, table.c.resource
    )
    for name, resource, used, cap in connection.execute(query):
        usage.setdefault(name, {})[resource] = (int(used), int(cap))
    return usage


def tenant_usage(connection: sa.Connection) -> dict[str, dict[str, tuple[int, int]]]:
    return usage_by_holder(connection, schema.tenant_quota, "tenant")


def pool_usage(connection: sa.Connection) -> dict[str, dict[str, tuple[int, int]]]:
    return usage_by_holder(connection, schema.pool_capacity, "pool")


def all_usage(
    connection: sa.Connection,
) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, dict[str, tuple[int, int]]]]:
    """Tenant and pool usage in one round trip (the admission hot path)."""
    tenants: dict[str, dict[str, tuple[int, int]]] = {}
    pools: dict[str, dict[str, tuple[int, int]]] = {}
    for kind, holder, resource, used, cap in connection.execute(statements.usage_query()):
        (tenants if kind == "t" else pools).setdefault(holder, {})[resource] = (
            int(used), int(cap))
    return tenants, pools


def adjust_usage(
    connection: sa.Connection,
    table: sa.Table,
    holder_column: str,
    holder: str,
    amounts: Mapping[str, int],
    *,
    charge: bool,
) -> bool:
    """Charge (or return) ``amounts`` on one holder's rows in one conditional UPDATE.

    True when it hit one row per resource; otherwise the caller must roll back.
    """
    resources = tuple(sorted(amounts))
    parameters: dict[str, Any] = {f"amount_{i}": amounts[r] for i, r in enumerate(resources)}
    parameters["holder"] = holder
    result = connection.execute(
        statements.adjust_statement(table, holder_column, resources, charge), parameters
    )
    return result.rowcount == len(resources)
