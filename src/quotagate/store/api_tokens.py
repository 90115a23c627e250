"""The rows behind API tokens (``qg_api_token``); the rules are ``quotagate.auth.tokens``'s."""

from __future__ import annotations

from typing import Any, TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from quotagate.store import schema
from quotagate.store.dialect import raise_translated, reading
from quotagate.store.driver import run_driver_transaction

__all__ = ["TokenRow", "find", "insert", "list_rows", "lock", "mark_revoked", "target_exists"]

_token = schema.api_token
_BY_ID = sa.select(_token).where(_token.c.id == sa.bindparam("token_id"))
_COLUMNS = tuple(_token.columns.keys())


class TokenRow(TypedDict):
    id: str
    secret_hash: str
    tenant: str | None
    admin: bool
    executor_target: str | None
    label: str | None
    created: float
    revoked: float | None


def _row(mapping: Any) -> TokenRow:
    return TokenRow(
        id=mapping["id"], secret_hash=mapping["secret_hash"], tenant=mapping["tenant"],
        admin=bool(mapping["admin"]), executor_target=mapping["executor_target"], label=mapping["label"],
        created=float(mapping["created"]),
        revoked=None if mapping["revoked"] is None else float(mapping["revoked"]),
    )


def target_exists(connection: sa.Connection, name: str) -> bool:
    target = schema.delivery_target
    return connection.execute(sa.select(target.c.name).where(target.c.name == name)).first() is not None


def insert(connection: sa.Connection, row: TokenRow) -> None:
    connection.execute(_token.insert().values(**row))


def list_rows(engine: Engine, *, include_revoked: bool = True) -> list[TokenRow]:
    """Every token row, oldest first."""
    query = sa.select(_token).order_by(_token.c.created, _token.c.id)
    if not include_revoked:
        query = query.where(_token.c.revoked.is_(None))
    with reading(engine) as connection:
        return [_row(row) for row in connection.execute(query).mappings()]


def lock(connection: sa.Connection, token_id: str) -> TokenRow | None:
    """Inside a transaction: the row, locked until it ends (None if there is none)."""
    row = connection.execute(
        sa.select(_token).where(_token.c.id == token_id).with_for_update()
    ).mappings().first()
    return None if row is None else _row(row)


def mark_revoked(connection: sa.Connection, token_id: str, at: float) -> None:
    connection.execute(_token.update().where(_token.c.id == token_id).values(revoked=at))


def find(engine: Engine, token_id: str) -> TokenRow | None:
    """The row by id, in one statement (every API call starts here).

    On the driver connection of a pooled one (quotagate.store.driver), in autocommit
    where the driver switches for free (psycopg, sqlite3; MySQL's keeps its
    transaction): SQLAlchemy's ``Connection`` cost more than the read itself
    (docs/decisions/315-token-read-on-the-driver.md). A primary-key read waits on no
    lock, so it runs under no read deadline.
    """
    try:
        rows = run_driver_transaction(
            engine, lambda transaction: transaction.rows(_BY_ID, {"token_id": token_id}),
            autocommit=True,
        )
    except DBAPIError as error:
        raise_translated(error)
    return None if not rows else _row(dict(zip(_COLUMNS, rows[0], strict=True)))
