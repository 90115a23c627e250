"""Token buckets as rows of ``qg_rate_bucket``: one conditional UPDATE decides a take.

The refill is computed in the statement from the *database's* clock, so any
number of API processes on any number of machines agree on elapsed time::

    UPDATE qg_rate_bucket
    SET tokens  = LEAST(capacity, tokens + GREATEST(0, now - updated) * refill) - :n,
        updated = GREATEST(updated, now)
    WHERE key = :key
      AND LEAST(capacity, tokens + GREATEST(0, now - updated) * refill) >= :n

One row affected means granted. The row lock the UPDATE takes serialises
concurrent takes on one bucket (SQLite: the database write lock), and the WHERE
is re-checked on the row version the UPDATE finally locks, so two takes can
never both spend the last token. Buckets of different tenants are different
rows and do not wait for each other.

Two engine details shape the statement:

* MySQL evaluates SET assignments left to right, each seeing the columns
  already assigned. ``tokens`` is therefore assigned before ``updated`` (and,
  in a reconfiguration, before ``capacity`` and ``refill_per_second``), so
  its refill uses the old values — hence ``ordered_values``.
* PostgreSQL's clock (``clock_timestamp()``) moves within a statement. The
  WHERE clause is evaluated before the SET list, so the SET sees the same or
  a later time: at least as many tokens as the check saw, never a negative
  balance. ``GREATEST(updated, now)`` keeps ``updated`` from going backwards
  when transactions commit out of order or the clock steps back.

The rows are named by their key (``quotagate.rate.keys.BucketKey.name``):
the rate package maps its keys, stores and policies onto these statements
(``quotagate.rate.sql``, ``quotagate.rate.quotas``).
"""


from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.bucket import BucketConfig, BucketState, Decision, decide, refill
from quotagate.store import schema
from quotagate.store.dialect import database_now, dialect_now
from quotagate.store.driver import DriverTransaction

bucket = schema.rate_bucket


def _least(left: Any, right: Any) -> sa.ColumnElement[float]:
    # CASE rather than LEAST/MIN: the one spelling all three engines share.
    return sa.case((left < right, left), else_=right)


def _greatest(left: Any, right: Any) -> sa.ColumnElement[float]:
    return sa.case((left > right, left), else_=right)


def _available(now: sa.ColumnElement[float]) -> sa.ColumnElement[float]:
    """Tokens in the row as of ``now``: refilled since ``updated``, capped at capacity."""
    elapsed = _greatest(sa.literal(0.0, sa.Double), now - bucket.c.updated)
    return _least(bucket.c.capacity, bucket.c.tokens + elapsed * bucket.c.refill_per_second)


def _config(row: Any) -> BucketConfig:
    return BucketConfig(float(row.capacity), float(row.refill_per_second))


def read(connection: sa.Connection, name: str) -> tuple[BucketConfig, float] | None:
    """The bucket's shape and the tokens it holds now, or None if it has none."""
    row = connection.execute(
        sa.select(
            bucket.c.capacity, bucket.c.refill_per_second, bucket.c.tokens, bucket.c.updated,
            database_now(connection).label("now"),
        ).where(bucket.c.key == name)
    ).first()
    if row is None:
        return None
    config = _config(row)
    state = refill(config, BucketState(float(row.tokens), float(row.updated)), float(row.now))
    return config, state.tokens


def read_config(connection: sa.Connection, name: str) -> BucketConfig | None:
    """The bucket's shape, or None if it has none."""
    row = connection.execute(
        sa.select(bucket.c.capacity, bucket.c.refill_per_second).where(bucket.c.key == name)
    ).first()
    return None if row is None else _config(row)


_AFTER = (bucket.c.tokens, bucket.c.capacity, bucket.c.refill_per_second)


def _updated_row(connection: sa.Connection, statement: sa.Update, name: str) -> Any:
    """Run a bucket UPDATE; the row's tokens and shape afterwards, or None if it matched nothing."""
    if connection.dialect.update_returning:
        return connection.execute(statement.returning(*_AFTER)).first()
    if connection.execute(statement).rowcount != 1:
        return None
    # MySQL/MariaDB have no UPDATE … RETURNING; the row is ours until commit.
    return connection.execute(sa.select(*_AFTER).where(bucket.c.key == name)).one()


def _tokens_after(connection: sa.Connection, statement: sa.Update, name: str) -> float | None:
    row = _updated_row(connection, statement, name)
    return None if row is None else float(row.tokens)


@lru_cache(maxsize=8)
def take_statement(dialect: str, returning: bool) -> sa.Update:
    """The conditional take, built once per dialect (``bucket_key`` and ``amount`` bound).

    Building it per call cost more CPU than the UPDATE itself takes on a nearby
    database (docs/performance.md).
    """
    now = dialect_now(dialect)
    available = _available(now)
    amount = sa.bindparam("amount", type_=sa.Integer)
    statement = (
        bucket.update()
        .where(bucket.c.key == sa.bindparam("bucket_key"), available >= amount)
        .ordered_values(
            (bucket.c.tokens, available - amount),
            (bucket.c.updated, _greatest(bucket.c.updated, now)),
        )
    )
    return statement.returning(*_AFTER) if returning else statement


@lru_cache(maxsize=1)
def one_statement_take() -> sa.CompoundSelect[Any]:
    """PostgreSQL's take in one round trip, granted or refused.

    The conditional UPDATE in a CTE; when it updated nothing, the same
    statement reads the row as the statement's snapshot saw it, for the
    refusal's tokens left and retry-after. The decision is the UPDATE's alone
    (its row lock and re-checked WHERE); a separate read after a refusal was a
    second round trip and half the refusal's time.
    """
    taken = take_statement("postgresql", True).cte("taken")
    return sa.union_all(
        sa.select(sa.literal(True).label("granted"), taken.c.tokens, taken.c.capacity,
                  taken.c.refill_per_second,
                  sa.null().label("updated"), sa.null().label("now")),
        sa.select(sa.literal(False), bucket.c.tokens, bucket.c.capacity,
                  bucket.c.refill_per_second, bucket.c.updated, dialect_now("postgresql"))
        .where(bucket.c.key == sa.bindparam("bucket_key"),
               ~sa.exists(sa.select(taken.c.tokens))),
    )


@lru_cache(maxsize=8)
def _read_statement(dialect: str) -> sa.Select[Any]:
    return sa.select(
        bucket.c.capacity, bucket.c.refill_per_second, bucket.c.tokens, bucket.c.updated,
        dialect_now(dialect).label("now"),
    ).where(bucket.c.key == sa.bindparam("bucket_key"))


@lru_cache(maxsize=8)
def available_statement(dialect: str) -> sa.Select[Any]:
    """The bucket's shape and its tokens now, refilled in SQL as the take's WHERE refills them."""
    return sa.select(
        bucket.c.capacity, bucket.c.refill_per_second, _available(dialect_now(dialect)),
    ).where(bucket.c.key == sa.bindparam("bucket_key"))


@lru_cache(maxsize=1)
def after_statement() -> sa.Select[Any]:
    return sa.select(*_AFTER).where(bucket.c.key == sa.bindparam("bucket_key"))


def take_in(connection: sa.Connection, name: str, amount: int = 1) -> Decision | None:
    """Take ``amount`` tokens inside the caller's transaction; None if there is no bucket."""
    dialect = connection.dialect
    # Not "key": a column of the updated table cannot name a bound parameter.
    parameters = {"bucket_key": name, "amount": amount}
    if dialect.update_returning:
        row = connection.execute(take_statement(dialect.name, True), parameters).first()
    elif connection.execute(take_statement(dialect.name, False), parameters).rowcount == 1:
        # MySQL/MariaDB have no UPDATE … RETURNING; the row is ours until commit.
        row = connection.execute(after_statement(), parameters).one()
    else:
        row = None
    if row is not None:
        return decide(_config(row), float(row.tokens), amount, True)
    current = connection.execute(_read_statement(dialect.name), parameters).first()
    if current is None:
        return None
    config = _config(current)
    state = refill(config, BucketState(float(current.tokens), float(current.updated)),
                   float(current.now))
    return decide(config, state.tokens, amount, False)


def take_on_driver(transaction: DriverTransaction, name: str, amount: int) -> Decision | None:
    """:func:`take_in` with the same statements, run by :mod:`quotagate.store.driver`."""
    dialect = transaction.dialect
    parameters = {"bucket_key": name, "amount": amount}
    row: Any = None
    if dialect.name == "postgresql":
        answer = transaction.rows(one_statement_take(), parameters)
        if not answer:
            return None
        granted, tokens, capacity, refill_per_second, updated, now = answer[0]
        config = BucketConfig(float(capacity), float(refill_per_second))
        if not granted:
            tokens = refill(config, BucketState(float(tokens), float(updated)), float(now)).tokens
        return decide(config, float(tokens), amount, bool(granted))
    if dialect.update_returning:
        rows = transaction.rows(take_statement(dialect.name, True), parameters)
        row = rows[0] if rows else None
    elif transaction.rowcount(take_statement(dialect.name, False), parameters) == 1:
        row = transaction.rows(after_statement(), parameters)[0]
    if row is not None:
        tokens, capacity, refill_per_second = row
        config = BucketConfig(float(capacity), float(refill_per_second))
        return decide(config, float(tokens), amount, True)
    rows = transaction.rows(_read_statement(dialect.name), parameters)
    if not rows:
        return None
    capacity, refill_per_second, tokens, updated, now = rows[0]
    config = BucketConfig(float(capacity), float(refill_per_second))
    state = refill(config, BucketState(float(tokens), float(updated)), float(now))
    return decide(config, state.tokens, amount, False)


def add_in(connection: sa.Connection, name: str, amount: int) -> float | None:
    """Top up inside the caller's transaction; the tokens now, or None if there is no bucket."""
    now = database_now(connection)
    statement = (
        bucket.update()
        .where(bucket.c.key == name)
        .ordered_values(
            (bucket.c.tokens, _least(bucket.c.capacity, _available(now) + amount)),
            (bucket.c.updated, _greatest(bucket.c.updated, now)),
        )
    )
    return _tokens_after(connection, statement, name)


def configure_in(
    connection: sa.Connection, name: str, tenant: str, config: BucketConfig, *, fresh: bool
) -> float:
    """Create or reshape the bucket row ``name`` of ``tenant`` inside the caller's transaction;
    the tokens now."""
    now = database_now(connection)
    if not fresh:
        statement = (
            bucket.update()
            .where(bucket.c.key == name)
            .ordered_values(
                # Refill under the old shape until now, then cap at the new capacity:
                # assigned first, so MySQL still sees the old columns here.
                (bucket.c.tokens, _least(sa.literal(config.capacity, sa.Double), _available(now))),
                (bucket.c.updated, _greatest(bucket.c.updated, now)),
                (bucket.c.capacity, config.capacity),
                (bucket.c.refill_per_second, config.refill_per_second),
            )
        )
        tokens = _tokens_after(connection, statement, name)
        if tokens is not None:
            return tokens
    connection.execute(bucket.delete().where(bucket.c.key == name))
    connection.execute(
        bucket.insert().from_select(
            ["key", "tenant", "capacity", "refill_per_second", "tokens", "updated"],
            sa.select(
                sa.literal(name, bucket.c.key.type),
                sa.literal(tenant, bucket.c.tenant.type),
                sa.literal(config.capacity, sa.Double),
                sa.literal(config.refill_per_second, sa.Double),
                sa.literal(config.capacity, sa.Double),
                now,
            ),
        )
    )
    return config.capacity


def forget_in(connection: sa.Connection, name: str) -> bool:
    """Delete the bucket row; False if there was none."""
    return connection.execute(bucket.delete().where(bucket.c.key == name)).rowcount > 0


@dataclass(frozen=True)
class TakeStatements:
    """What a take on a kept connection runs: the conditional take, the read of a granted
    row, the refusal's read (``quotagate.rate.held_takes``)."""

    take: sa.Executable
    after: sa.Executable  # MySQL/MariaDB: the granted row, with no UPDATE … RETURNING
    available: sa.Executable  # the shape and the tokens now, refilled in SQL
    one_statement: bool  # ``take`` answers granted or refused with the refused row (PostgreSQL)
    returning: bool  # ``take`` returns the granted row


def take_statements(dialect: sa.Dialect) -> TakeStatements:
    """The statements of :class:`TakeStatements` for ``dialect``."""
    name, returning = dialect.name, bool(dialect.update_returning)
    return TakeStatements(
        take=one_statement_take() if name == "postgresql" else take_statement(name, returning),
        after=after_statement(), available=available_statement(name),
        one_statement=name == "postgresql", returning=returning)


def tenant_exists(connection: sa.Connection, tenant: str) -> bool:
    """Is there a tenant of that name (whose bucket a row may be)?"""
    return connection.execute(
        sa.select(schema.tenant.c.name).where(schema.tenant.c.name == tenant)
    ).first() is not None
