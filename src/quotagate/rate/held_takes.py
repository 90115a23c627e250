"""The SQL rate store's takes on its kept connection, and the refusals it reads first.

docs/decisions/114-sql-takes-on-a-held-connection.md. The statements are
:mod:`quotagate.store.rate_buckets`'s; this module runs them on the store's autocommit
:class:`quotagate.store.kept_connection.KeptConnection`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import sqlalchemy as sa

from quotagate.domain.bucket import BucketConfig, BucketState, Decision, decide, refill
from quotagate.rate.keys import BucketKey
from quotagate.store.driver import compiled_for_driver
from quotagate.store.kept_connection import KeptConnection
from quotagate.store.rate_buckets import TakeStatements


class Prepared:
    """A statement compiled once for one dialect, with its driver parameters built fast."""

    def __init__(self, dialect: sa.Dialect, statement: sa.Executable) -> None:
        compiled = compiled_for_driver(dialect, statement)
        self.sql = compiled.sql
        # The literals the statement binds itself, converted once (SQLite's floats).
        self._fixed = {
            name: compiled.processors[name](value) if name in compiled.processors else value
            for name, value in compiled.fixed.items()
        }
        # The driver's own picker of the positional tuple (None: a named paramstyle).
        self._pick = compiled.pick

    def parameters(self, given: Mapping[str, Any]) -> Any:
        values = {**self._fixed, **given}
        return values if self._pick is None else self._pick(values)


@lru_cache(maxsize=256)
def _shape(capacity: float, refill_per_second: float) -> BucketConfig:
    """A bucket's shape from its row, built (and validated) once per distinct shape."""
    return BucketConfig(float(capacity), float(refill_per_second))


class HeldTakes:
    """Takes on the store's kept autocommit connection (:mod:`quotagate.store.kept_connection`).

    The same statements as the store's other takes (:mod:`quotagate.store.rate_buckets`
    hands them over), prepared once, each in autocommit. One more step: a
    bucket whose last take here was refused, and whose refill cannot have
    covered a take since, is **read first**. A read that finds too few tokens
    is the refusal — the tokens it saw were committed, and nothing but time
    and top-ups adds any, so at that read the conditional UPDATE would have
    refused too — with no UPDATE and its write lock (SQLite's is the
    database's). A read that finds enough goes on to the UPDATE, which alone
    grants. Under overload most takes are refusals; on SQLite and MySQL a
    refusal was the UPDATE and then this read.
    """

    # Keys remembered as refused; past this many the memory starts again (it is a hint).
    REMEMBERED = 10_000

    def __init__(self, kept: KeptConnection, dialect: sa.Dialect,
                 statements: TakeStatements) -> None:
        self.kept = kept
        self._dialect = dialect
        self._given = statements
        self._one_statement = statements.one_statement
        self._returning = statements.returning
        # Compiled at the first take, once connected: MySQL's dialect knows only
        # then which server it speaks to (MariaDB's CAST to DOUBLE).
        self._prepared: tuple[Prepared, Prepared, Prepared] | None = None
        # key -> monotonic time before which a take is expected to be refused.
        self._refused_until: dict[str, float] = {}
        self._parameters: dict[tuple[str, int], tuple[Any, Any, Any]] = {}

    def take(self, key: BucketKey, amount: int) -> tuple[bool, Decision | None]:
        """``(True, decision or None if no bucket)``, or ``(False, None)`` if the connection is busy."""
        name = key.name
        read_first = self._refused_until.get(name, 0.0) > time.monotonic()
        done, decision = self.kept.attempt(
            lambda cursor: self._decide(cursor, name, amount, read_first))
        if decision is not None:
            self._remember(name, decision)
        return done, decision

    def _statements(self) -> tuple[Prepared, Prepared, Prepared]:
        """The take, the read of a granted row (MySQL) and the read of a refused one."""
        if self._prepared is None:
            dialect, given = self._dialect, self._given
            self._prepared = (Prepared(dialect, given.take), Prepared(dialect, given.after),
                              Prepared(dialect, given.available))
        return self._prepared

    def _bound(self, name: str, amount: int) -> tuple[Any, Any, Any]:
        """The driver parameters of the three statements for one key and amount, built once.

        (SQLite's take binds 31 positional parameters; building them was a
        tenth of a take.)
        """
        bound = self._parameters.get((name, amount))
        if bound is None:
            given = {"bucket_key": name, "amount": amount}
            take, after, read = self._statements()
            bound = (take.parameters(given), after.parameters(given), read.parameters(given))
            if len(self._parameters) >= self.REMEMBERED:
                self._parameters.clear()
            self._parameters[(name, amount)] = bound
        return bound

    def _decide(self, cursor: Any, name: str, amount: int, read_first: bool) -> Decision | None:
        take, after, read = self._statements()
        take_parameters, after_parameters, read_parameters = self._bound(name, amount)
        if read_first:
            refused = self._refusal(cursor, read, read_parameters, amount, only_if_short=True)
            if refused is not None:
                return refused
        cursor.execute(take.sql, take_parameters)
        if self._one_statement:
            answer = cursor.fetchall()
            if not answer:
                return None
            granted, tokens, capacity, refill_per_second, updated, now = answer[0]
            config = _shape(capacity, refill_per_second)
            if not granted:
                tokens = refill(config, BucketState(float(tokens), float(updated)),
                                float(now)).tokens
            return decide(config, float(tokens), amount, bool(granted))
        if self._returning:
            rows = cursor.fetchall()
            row = rows[0] if rows else None
        elif cursor.rowcount == 1:
            # Committed already (autocommit): the tokens read are those of this
            # moment, possibly after another take — the numbers reported, not the decision.
            cursor.execute(after.sql, after_parameters)
            row = cursor.fetchone()
        else:
            row = None
        if row is not None:
            tokens, capacity, refill_per_second = row
            return decide(_shape(capacity, refill_per_second), float(tokens), amount, True)
        return self._refusal(cursor, read, read_parameters, amount, only_if_short=False)

    @staticmethod
    def _refusal(cursor: Any, read: Prepared, parameters: Any, amount: int, *,
                 only_if_short: bool) -> Decision | None:
        """The refusal as the bucket reads now; None if there is no bucket, or
        (``only_if_short``) if it holds enough for the take."""
        cursor.execute(read.sql, parameters)
        row = cursor.fetchone()
        if row is None:
            return None
        capacity, refill_per_second, tokens = row
        tokens = float(tokens)
        if only_if_short and tokens >= amount:
            return None
        return decide(_shape(capacity, refill_per_second), tokens, amount, False)

    def _remember(self, name: str, decision: Decision) -> None:
        if decision.granted:
            self._refused_until.pop(name, None)
            return
        if len(self._refused_until) >= self.REMEMBERED:
            self._refused_until.clear()
        wait = decision.retry_after
        self._refused_until[name] = math.inf if wait is None else time.monotonic() + wait
