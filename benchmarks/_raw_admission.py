"""The admission transaction written as raw SQL through the driver: the limit we measure against.

No SQLAlchemy here: psycopg, pymysql or sqlite3 directly, on quotagate's own
schema and indexes. It follows docs/admission.md step by step: pick the best waiting
request that fits, lock it (``FOR UPDATE SKIP LOCKED``), choose the best-fit
pool, charge tenant and pool with conditional UPDATEs that must each hit one
row, mark the request reserved, insert its outbox row, commit.

It is deliberately leaner than ``Ledger.admit``: tenant and pool usage come
back in one statement, it reads 4 queue heads per tenant instead of 32, it
admits one request per transaction, and it writes no audit row and runs no
expiry pass. Whatever ``Ledger.admit`` spends beyond this is the price of
SQLAlchemy, of our Python and of the extra statements.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy.engine import make_url

from quotagate.domain.placement import best_fit_pool, fits

# Enough candidates per tenant for 4 admitters to skip each other's locked rows.
HEADS_PER_TENANT = 4
_MYSQL_RETRY_CODES = {1205, 1213}
_PG_RETRY_SQLSTATES = {"40001", "40P01", "55P03"}


class _Missed(Exception):
    """A conditional UPDATE hit no row: another admitter got there first. Roll back and rerun."""


class RawAdmission:
    """One driver connection that admits one waiting request per transaction."""

    def __init__(self, url: str, tenants: Sequence[str], *, audit: bool = False) -> None:
        """``audit``: also write the admission's audit row, as ``Ledger.admit`` does. Off
        for the baseline of issue 14 (docs/decisions/021); ``admit_breakdown.py`` turns it
        on to show what the audit row alone costs (docs/decisions/032)."""
        parsed = make_url(url)
        self.audit = audit
        self.backend = parsed.get_backend_name()
        self.tenants = list(tenants)
        self.connection: Any
        if self.backend == "sqlite":
            # Same settings as quotagate's SQLite engine: WAL, and the write
            # lock taken at BEGIN so two admitters never both read "room left".
            self.connection = sqlite3.connect(parsed.database or "", isolation_level=None,
                                              timeout=30)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
                self.connection.execute(f"PRAGMA {pragma}")
        elif self.backend == "postgresql":
            import psycopg

            self.connection = psycopg.connect(
                host=parsed.host, port=parsed.port or 5432, user=parsed.username,
                password=parsed.password, dbname=parsed.database, autocommit=False,
            )
            self.connection.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        elif self.backend == "mysql":
            import pymysql

            self.connection = pymysql.connect(
                host=parsed.host or "127.0.0.1", port=parsed.port or 3306,
                user=parsed.username or "root", password=parsed.password or "",
                database=parsed.database, autocommit=False,
            )
            with self.connection.cursor() as cursor:
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        else:
            raise ValueError(f"no raw driver for {self.backend!r}")
        self.skip_locked = self.backend in ("postgresql", "mysql")
        self.retries = 0
        self._heads_sql = self._sql(
            " UNION ALL ".join(
                "SELECT * FROM (SELECT id, tenant, cost, target, queue_key, created"
                " FROM qg_request WHERE tenant = %s AND state = 'waiting'"
                f" ORDER BY queue_key, created, id LIMIT {HEADS_PER_TENANT}) AS head_{index}"
                for index in range(len(self.tenants))
            )
        )
        self._usage_sql = self._sql(
            "SELECT 'tenant', tenant, resource, used, cap FROM qg_tenant_quota"
            " UNION ALL SELECT 'pool', pool, resource, used, cap FROM qg_pool_capacity"
        )
        self._lock_sql = self._sql(
            "SELECT id FROM qg_request WHERE id = %s AND state = 'waiting' FOR UPDATE SKIP LOCKED"
        )
        self._charge_tenant_sql = self._sql(
            "UPDATE qg_tenant_quota SET used = used + %s"
            " WHERE tenant = %s AND resource = %s AND used + %s <= cap"
        )
        self._charge_pool_sql = self._sql(
            "UPDATE qg_pool_capacity SET used = used + %s"
            " WHERE pool = %s AND resource = %s AND used + %s <= cap"
        )
        self._reserve_sql = self._sql(
            "UPDATE qg_request SET state = 'reserved', pool = %s, updated = %s"
            " WHERE id = %s AND state = 'waiting'"
        )
        self._outbox_sql = self._sql(
            "INSERT INTO qg_outbox (request_id, tenant, target, created, attempts,"
            " next_attempt_at, delivered) VALUES (%s, %s, %s, %s, 0, %s, %s)"
        )
        self._audit_sql = self._sql(
            "INSERT INTO qg_audit (at, actor, tenant, operation, target, outcome, reason)"
            " VALUES (%s, 'admission', %s, 'admit', %s, 'reserved', %s)"
        )

    def _sql(self, text: str) -> str:
        return text.replace("%s", "?") if self.backend == "sqlite" else text

    def close(self) -> None:
        self.connection.close()

    def admit_one(self) -> int:
        """Admit the best waiting request that fits; return 1, or 0 if none fits."""
        delay = 0.002
        for _ in range(50):
            try:
                return self._transaction()
            except _Missed:
                self.connection.rollback()
                self.retries += 1
            except Exception as error:
                self.connection.rollback()
                if not self._retryable(error):
                    raise
                self.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        return 0

    def _retryable(self, error: Exception) -> bool:
        if isinstance(error, sqlite3.OperationalError):
            return "locked" in str(error) or "busy" in str(error)
        if getattr(error, "sqlstate", None) in _PG_RETRY_SQLSTATES:
            return True
        arguments: tuple[Any, ...] = getattr(error, "args", ())
        return bool(arguments) and arguments[0] in _MYSQL_RETRY_CODES

    def _transaction(self) -> int:
        cursor = self.connection.cursor()
        if self.backend == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")
        tenants, pools = self._read_usage(cursor)
        cursor.execute(self._heads_sql, self.tenants)
        heads = sorted(cursor.fetchall(), key=lambda row: (row[4], row[5], row[0]))
        for _index, (request_id, tenant, _cost, target, _key, _created), cost, pool in \
                self._fitting(heads, tenants, pools):
            if self.skip_locked:
                cursor.execute(self._lock_sql, (request_id,))
                if cursor.fetchone() is None:
                    continue  # another admitter holds it or just reserved it
            self._reserve(cursor, request_id, tenant, target, pool, cost)
            self.connection.commit()
            return 1
        self.connection.commit()
        return 0

    @staticmethod
    def _fitting(
        heads: Sequence[Any], tenants: dict[str, dict[str, tuple[int, int]]],
        pools: dict[str, dict[str, tuple[int, int]]],
    ) -> Iterator[tuple[int, Any, dict[str, int], str]]:
        """Each head (in order) whose cost fits its tenant and some pool: its index, row,
        cost and best-fit pool."""
        for index, head in enumerate(heads):
            cost: dict[str, int] = json.loads(head[2])
            if not fits(cost, tenants.get(head[1], {})):
                continue
            pool = best_fit_pool(cost, pools)
            if pool is not None:
                yield index, head, cost, pool

    def _read_usage(self, cursor: Any) -> tuple[dict[str, dict[str, tuple[int, int]]],
                                                dict[str, dict[str, tuple[int, int]]]]:
        """Tenant and pool usage, ``{holder: {resource: (used, cap)}}`` each, in one read."""
        tenants: dict[str, dict[str, tuple[int, int]]] = {}
        pools: dict[str, dict[str, tuple[int, int]]] = {}
        cursor.execute(self._usage_sql)
        for kind, holder, resource, used, cap in cursor.fetchall():
            usage = tenants if kind == "tenant" else pools
            usage.setdefault(holder, {})[resource] = (int(used), int(cap))
        return tenants, pools

    def _reserve(
        self, cursor: Any, request_id: str, tenant: str, target: str | None, pool: str,
        cost: dict[str, int],
    ) -> None:
        # Same lock order as the ledger: request, tenant rows, pool rows, by resource.
        for statement, holder in ((self._charge_tenant_sql, tenant), (self._charge_pool_sql, pool)):
            for resource, amount in sorted(cost.items()):
                cursor.execute(statement, (amount, holder, resource, amount))
                if cursor.rowcount != 1:
                    raise _Missed(f"{holder} {resource}")
        now = time.time()
        cursor.execute(self._reserve_sql, (pool, now, request_id))
        if cursor.rowcount != 1:
            raise _Missed(request_id)
        cursor.execute(self._outbox_sql, (request_id, tenant, target, now, now, False))
        if self.audit:
            cursor.execute(self._audit_sql, (now, tenant, request_id, f"pool={pool}"))
