"""Conversions between table rows and domain objects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from quotagate.domain.model import Cost, Request, RequestState
from quotagate.errors import NotFound, quoted
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
        max_runtime=row.get("max_runtime"),
        attempt=int(row.get("attempt") or 1),
    )


def visible_request_row(connection: sa.Connection, request_id: str,
                        tenant: str | None) -> sa.RowMapping:
    """The request's row, if ``tenant`` (None: an operator) may see it.

    Another tenant's request gets the same answer as an id that does not exist, so a
    tenant learns nothing of others."""
    row = connection.execute(
        sa.select(schema.request).where(schema.request.c.id == request_id)
    ).mappings().first()
    if row is None or (tenant is not None and row["tenant"] != tenant):
        raise NotFound(f"request {quoted(request_id)} does not exist", code="unknown_request")
    return row


def holder_usage(
    connection: sa.Connection, table: sa.Table, holder_column: str, holder: str
) -> dict[str, tuple[int, int]]:
    """``{resource: (used, cap)}`` of one tenant or pool (summed over a pool's slices)."""
    query = (
        sa.select(table.c.resource,
                  sa.cast(sa.func.sum(table.c.used), sa.BigInteger),
                  sa.cast(sa.func.sum(table.c.cap), sa.BigInteger))
        .where(table.c[holder_column] == holder)
        .group_by(table.c.resource)
        .order_by(table.c.resource)
    )
    return {resource: (int(used), int(cap)) for resource, used, cap in connection.execute(query)}


def all_usage(
    connection: sa.Connection,
) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, dict[str, tuple[int, int]]]]:
    """``({tenant: {resource: (used, cap)}}, {pool: …})`` in one round trip."""
    return usage_from_rows(connection.execute(statements.usage_query()))


def usage_from_rows(
    rows: Iterable[Sequence[Any]],
) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, dict[str, tuple[int, int]]]]:
    """:func:`all_usage` from the rows of :func:`quotagate.store.statements.usage_query`."""
    tenants: dict[str, dict[str, tuple[int, int]]] = {}
    pools: dict[str, dict[str, tuple[int, int]]] = {}
    for kind, holder, resource, used, cap in rows:
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
