"""Admission's driver-level transactions (quotagate.store.driver) behave like SQLAlchemy's.

Retries, error types, rollback and the pool's handling of a dead connection
must not change because admission bypasses ``sqlalchemy.Connection``
(docs/decisions/023-admission-on-the-driver-connection.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from quotagate import Quotagate
from quotagate.errors import StoreUnavailable
from quotagate.store import engine as engine_module
from quotagate.store import kept_connection as kept_module
from quotagate.store import schema
from quotagate.store.dialect import run_transaction
from quotagate.store.driver import DriverTransaction, run_driver_transaction, run_on_connection
from quotagate.store.engine import create_engine
from quotagate.store.kept_connection import KeptConnection
from quotagate.store.ledger import Ledger


class _Stop(Exception):
    """Raised by the work to end a transaction that must leave nothing behind."""


def _outbox_insert(request_id: str) -> sa.Insert:
    return schema.outbox.insert().values(
        request_id=request_id, tenant="team-a", created=0.0, next_attempt_at=0.0
    )


def _outbox_ids(gate: Quotagate) -> list[str]:
    with gate.engine.connect() as connection:
        return list(connection.execute(sa.select(schema.outbox.c.request_id)).scalars())


def test_a_driver_error_is_sqlalchemys_and_rolls_back_everything(gate: Quotagate) -> None:
    with gate.engine.begin() as connection:
        connection.execute(_outbox_insert("taken"))

    def work(transaction: DriverTransaction) -> None:
        transaction.execute(_outbox_insert("first"), {})
        transaction.execute(_outbox_insert("taken"), {})  # duplicate key: the second fails

    with pytest.raises(IntegrityError):
        run_driver_transaction(gate.engine, work)
    assert _outbox_ids(gate) == ["taken"]


def test_on_a_connection_a_driver_error_is_sqlalchemys_and_rolls_back_both_sides(
    gate: Quotagate,
) -> None:
    """The release's way (docs/decisions/246): the Connection's write and the driver's
    are one transaction, and the driver's error is the one reruns and translation know."""
    with gate.engine.begin() as connection:
        connection.execute(_outbox_insert("taken"))

    def work(connection: sa.Connection) -> None:
        connection.execute(_outbox_insert("by-the-connection"))

        def on_driver(transaction: DriverTransaction) -> None:
            transaction.execute(_outbox_insert("by-the-driver"), {})
            transaction.execute(_outbox_insert("taken"), {})  # duplicate key

        run_on_connection(connection, on_driver)

    with pytest.raises(IntegrityError):
        run_transaction(gate.engine, work)
    assert _outbox_ids(gate) == ["taken"]


def test_on_a_connection_the_driver_sees_the_connections_writes_and_commits_with_them(
    gate: Quotagate,
) -> None:
    def work(connection: sa.Connection) -> list[str]:
        connection.execute(_outbox_insert("by-the-connection"))

        def on_driver(transaction: DriverTransaction) -> list[str]:
            transaction.execute(_outbox_insert("by-the-driver"), {})
            return sorted(row[0] for row in transaction.rows(
                sa.select(schema.outbox.c.request_id), {}))

        return run_on_connection(connection, on_driver)

    assert run_transaction(gate.engine, work) == ["by-the-connection", "by-the-driver"]
    assert sorted(_outbox_ids(gate)) == ["by-the-connection", "by-the-driver"]


def test_a_python_exception_rolls_back_and_passes_through(gate: Quotagate) -> None:
    def work(transaction: DriverTransaction) -> None:
        transaction.execute(_outbox_insert("written-then-stopped"), {})
        raise _Stop

    with pytest.raises(_Stop):
        run_driver_transaction(gate.engine, work)
    assert _outbox_ids(gate) == []
    # The pooled connection went back clean: the next transaction commits normally.
    run_driver_transaction(gate.engine, lambda t: t.execute(_outbox_insert("after"), {}))
    assert _outbox_ids(gate) == ["after"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_connection_killed_while_idle_is_replaced_before_use(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ping after idle (docs/decisions/025-ping-after-idle.md) finds the dead connection."""
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)
    engine = create_engine(db_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as connection:
            pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        killer = create_engine(db_url)
        with killer.connect() as connection:
            connection.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
        killer.dispose()
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid
        answer = run_driver_transaction(
            engine, lambda t: t.rows(sa.select(sa.literal(1)), {})[0][0]
        )
        assert answer == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize("url", ["postgresql://postgres@127.0.0.1:1/test",
                                 "mysql://root@127.0.0.1:1/test"])
def test_a_server_that_cannot_be_reached_is_store_unavailable(url: str) -> None:
    """Connect errors come out of the pool unwrapped; they must still read as an outage."""
    engine = create_engine(url)
    try:
        with pytest.raises(StoreUnavailable):
            run_driver_transaction(engine, lambda t: t.rows(sa.select(sa.literal(1)), {}))
    finally:
        engine.dispose()


def _driver_connection(transaction: DriverTransaction) -> int:
    """Which DBAPI connection the transaction runs on (its cursor's)."""
    return id(transaction._cursor.connection)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_keeps_the_committed_connection_out_of_the_pool_for_the_next_transaction(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    kept = KeptConnection(engine)
    try:
        first = run_driver_transaction(engine, _driver_connection, kept=kept)
        assert engine.pool.checkedout() == 1  # kept, not checked in
        second = run_driver_transaction(engine, _driver_connection, kept=kept)
        assert second == first
        kept.close()
        assert engine.pool.checkedout() == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_failed_transaction_hands_its_connection_back_to_the_pool(db_url: str) -> None:
    engine = create_engine(db_url)
    kept = KeptConnection(engine)
    try:
        run_driver_transaction(engine, _driver_connection, kept=kept)

        def work(transaction: DriverTransaction) -> None:
            transaction.execute(_outbox_insert("written-then-stopped"), {})
            raise _Stop

        with pytest.raises(_Stop):
            run_driver_transaction(engine, work, kept=kept)
        assert engine.pool.checkedout() == 0  # rolled back by the pool's rules, not kept
        with engine.connect() as connection:
            assert connection.execute(sa.select(sa.func.count()).select_from(schema.outbox)
                                      ).scalar_one() == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_after_dispose_the_kept_connection_is_not_used(db_url: str) -> None:
    engine = create_engine(db_url)
    kept = KeptConnection(engine)
    try:
        before = run_driver_transaction(engine, _driver_connection, kept=kept)
        engine.dispose()
        after = run_driver_transaction(engine, lambda t: (
            t.execute(_outbox_insert("after-dispose"), {}), _driver_connection(t))[1], kept=kept)
        assert after != before
        with engine.connect() as connection:
            assert connection.execute(sa.select(schema.outbox.c.request_id)).scalars().all() == [
                "after-dispose"]
    finally:
        kept.close()
        engine.dispose()


def test_literals_written_into_the_statement_keep_their_value(db_url: str) -> None:
    """Quotes, percent signs and backslashes survive; a named parameter is still bound."""
    tricky = "it's 100% \\1 %(name)s"
    statement = sa.select(sa.literal(tricky), sa.literal(4), sa.bindparam("name", type_=sa.String))
    engine = create_engine(db_url)
    try:
        row = run_driver_transaction(engine, lambda t: t.rows(statement, {"name": "given"})[0])
        assert tuple(row) == (tricky, 4, "given")
    finally:
        engine.dispose()


def test_given_values_are_bound_in_place_beside_the_statements_own_literals(db_url: str) -> None:
    """A typed value goes through its type's processing, a literal keeps its value beside
    it, and a statement of given values only takes them in its own order, not the given one."""
    typed = sa.select(sa.literal("fixed"), sa.bindparam("now", type_=sa.Double),
                      sa.bindparam("name", type_=sa.String))
    plain = sa.select(sa.bindparam("b", type_=sa.String), sa.bindparam("a", type_=sa.String))
    engine = create_engine(db_url)
    try:
        first, second = run_driver_transaction(engine, lambda t: (
            t.rows(typed, {"now": 2.5, "name": "given"})[0],
            t.rows(plain, {"a": "x", "b": "y"})[0]))
        assert tuple(first) == ("fixed", 2.5, "given")
        assert tuple(second) == ("y", "x")
    finally:
        engine.dispose()


_PID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
_KILL = {"postgresql": "SELECT pg_terminate_backend({pid})", "mysql": "KILL {pid}"}


def _server_pid(transaction: DriverTransaction) -> int:
    """The server session the transaction runs in."""
    return int(transaction.rows(sa.text(_PID[transaction.dialect.name]), {})[0][0])


def _kill_session(url: str, backend: str, pid: int) -> None:
    killer = create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with killer.connect() as connection:
            connection.exec_driver_sql(_KILL[backend].format(pid=pid))
            connection.commit()
    finally:
        killer.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"], indirect=True)
def test_servers_keep_the_committed_connection_for_the_next_transaction(
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kept_module, "PING_AFTER_IDLE", 3600.0)
    engine = create_engine(db_url)
    kept = KeptConnection(engine)
    try:
        first = run_driver_transaction(engine, _server_pid, kept=kept)
        assert engine.pool.checkedout() == 1  # kept, not checked in
        assert run_driver_transaction(engine, _server_pid, kept=kept) == first
        kept.close()
        assert engine.pool.checkedout() == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"], indirect=True)
def test_a_kept_connection_the_server_dropped_while_idle_is_replaced_before_use(
    db_url: str, backend: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pinged after idle, as the pool's checkout would (docs/decisions/025-ping-after-idle.md)."""
    monkeypatch.setattr(kept_module, "PING_AFTER_IDLE", 0.0)  # every take counts as idle
    engine = create_engine(db_url)
    kept = KeptConnection(engine)
    try:
        killed = run_driver_transaction(engine, _server_pid, kept=kept)
        _kill_session(db_url, backend, killed)
        # No error reaches the work: the dead session is dropped before it is used.
        fresh = run_driver_transaction(engine, _server_pid, kept=kept, attempts=1)
        assert fresh != killed
        assert engine.pool.checkedout() == 1
    finally:
        kept.close()
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"], indirect=True)
def test_a_kept_connection_back_in_use_at_once_is_not_pinged(
    db_url: str, backend: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Like the pool's: a drop inside the idle window fails one transaction, and only one."""
    monkeypatch.setattr(kept_module, "PING_AFTER_IDLE", 3600.0)
    engine = create_engine(db_url)
    kept = KeptConnection(engine)
    try:
        killed = run_driver_transaction(engine, _server_pid, kept=kept)
        _kill_session(db_url, backend, killed)
        with pytest.raises(StoreUnavailable):
            run_driver_transaction(engine, _server_pid, kept=kept)
        assert engine.pool.checkedout() == 0  # the dead one was dropped, not kept
        assert run_driver_transaction(engine, _server_pid, kept=kept) != killed
    finally:
        kept.close()
        engine.dispose()


# -- checked writes, batched on MariaDB (docs/decisions/036) -----------------------------


def _request_update(request_id: str) -> sa.Update:
    return (schema.outbox.update().where(schema.outbox.c.request_id == request_id)
            .values(attempts=schema.outbox.c.attempts + 1))


def test_a_write_that_missed_its_row_count_raises_its_failure_and_rolls_back(
    gate: Quotagate,
) -> None:
    def work(transaction: DriverTransaction) -> None:
        transaction.write(_outbox_insert("written-first"), {})
        transaction.expect(_request_update("written-first"), {}, 1, RuntimeError("not this"))
        transaction.expect(_request_update("missing"), {}, 1, _Stop("the missed write"))

    with pytest.raises(_Stop, match="the missed write"):
        run_driver_transaction(gate.engine, work)
    assert _outbox_ids(gate) == []


def test_a_write_run_row_by_row_must_change_every_row_or_raises_and_rolls_back(
    gate: Quotagate,
) -> None:
    """expect_rows: the one-row form of a checked write, run once per row (SQLite's
    charges, docs/decisions/051-sqlite-charges-row-by-row.md); one row missed is the
    failure, and the rows written before it are rolled back with everything else."""
    one_row = (schema.outbox.update().where(schema.outbox.c.request_id == sa.bindparam("id"))
               .values(attempts=schema.outbox.c.attempts + 1))
    with gate.engine.begin() as connection:
        connection.execute(_outbox_insert_rows(), [{"id": "one"}, {"id": "two"}])

    def missing_one(transaction: DriverTransaction) -> None:
        transaction.expect_rows(one_row, [{"id": "one"}, {"id": "absent"}, {"id": "two"}],
                                _Stop("a row missed"))

    with pytest.raises(_Stop, match="a row missed"):
        run_driver_transaction(gate.engine, missing_one)
    run_driver_transaction(gate.engine, lambda transaction: transaction.expect_rows(
        one_row, [{"id": "one"}, {"id": "two"}], RuntimeError("not this")))
    with gate.engine.connect() as connection:
        attempts = dict(connection.execute(
            sa.select(schema.outbox.c.request_id, schema.outbox.c.attempts)).all())
    assert {request_id: int(count) for request_id, count in attempts.items()} == {
        "one": 1, "two": 1}


def test_checked_writes_are_seen_by_the_next_read_of_their_transaction(gate: Quotagate) -> None:
    def work(transaction: DriverTransaction) -> list[tuple[str, int]]:
        transaction.write_many(_outbox_insert_rows(), [{"id": "one"}, {"id": "two"}])
        transaction.expect(_request_update("two"), {}, 1, _Stop("missed"))
        rows = transaction.rows(sa.select(schema.outbox.c.request_id, schema.outbox.c.attempts)
                                .order_by(schema.outbox.c.request_id), {})
        return [(row[0], int(row[1])) for row in rows]

    assert run_driver_transaction(gate.engine, work) == [("one", 0), ("two", 1)]
    assert _outbox_ids(gate) == ["one", "two"]


def _outbox_insert_rows() -> sa.Insert:
    return schema.outbox.insert().values(
        request_id=sa.bindparam("id"), tenant="team-a", created=0.0, next_attempt_at=0.0)


def test_a_driver_error_in_batched_writes_is_sqlalchemys_and_rolls_back(gate: Quotagate) -> None:
    with gate.engine.begin() as connection:
        connection.execute(_outbox_insert("taken"))

    insert = schema.outbox.insert().values(
        request_id=sa.bindparam("id"), tenant=sa.bindparam("tenant"), created=0.0,
        next_attempt_at=0.0)

    def work(transaction: DriverTransaction) -> None:
        transaction.write(insert, {"id": "first", "tenant": "secret-tenant"})
        # A duplicate key, seen at COMMIT at the latest.
        transaction.write(insert, {"id": "taken", "tenant": "secret-tenant"})

    with pytest.raises(IntegrityError) as raised:
        run_driver_transaction(gate.engine, work)
    assert _outbox_ids(gate) == ["taken"]
    # The engine hides parameters (they are payloads, reasons, token hashes): the
    # error shows none, batched (the values escaped into the statement sent) or not.
    assert "secret-tenant" not in str(raised.value)


@pytest.mark.parametrize("backend", ["mysql"], indirect=True)
def test_on_mariadb_an_admission_sends_its_reserve_charges_and_records_in_one_statement(
    gate: Quotagate, db_url: str,
) -> None:
    """Snapshot, heads, then one compound statement (the lock among its checks), then COMMIT."""
    from pymysql.cursors import Cursor

    sent: list[str] = []

    class CountingCursor(Cursor):  # type: ignore[misc]
        def execute(self, query: str, args: object = None) -> int:
            sent.append(query.split()[0] if args is None else "parameters")
            return int(super().execute(query, args))

    gate.set_pool("main", {"gpu": 4, "cpu": 8})
    gate.set_tenant("team-a", {"gpu": 4, "cpu": 8})
    engine = create_engine(db_url, connect_args={"cursorclass": CountingCursor})
    ledger = Ledger(engine, expiry_every=3600.0)
    try:
        with engine.connect():  # the dialect learns the server at the first connect
            pass
        if not engine.dialect.is_mariadb:
            pytest.skip("MySQL runs no compound statement outside a stored program")
        assert ledger.admit(1) == []  # the first one also runs the expiry pass
        gate.submit("job-1", "team-a", {"gpu": 1, "cpu": 2})
        sent.clear()
        assert [placement.id for placement in ledger.admit(1)] == ["job-1"]
    finally:
        ledger.close()
        engine.dispose()
    statements = [kind for kind in sent if kind != "SET"]  # the connection's own setup
    # Before: 8 statements (reserve, two charges, outbox and audit each their own), then 4
    # (the SKIP LOCKED lock its own; an admitter alone now checks it in the batch: 053).
    assert len(statements) == 3, sent
    assert statements[-1] == "BEGIN"
    with gate.engine.connect() as connection:
        assert connection.execute(sa.select(schema.request.c.state)).scalar_one() == "reserved"
        assert connection.execute(sa.select(sa.func.count()).select_from(schema.audit)
                                  .where(schema.audit.c.operation == "admit")).scalar_one() == 1
def _wide_statement(count: int) -> sa.Select[Any]:
    """``count`` bound values, a name used twice and a literal percent sign, in one SELECT."""
    return sa.select(
        sa.literal("100%"),
        *(sa.bindparam(f"value_{index}", type_=sa.Integer) for index in range(count)),
        sa.bindparam("value_0", type_=sa.Integer),
    )


def test_a_statement_of_many_parameters_keeps_every_value(db_url: str) -> None:
    """More parameters than psycopg caches a parse for (50), each where it was bound."""
    count = 70
    statement = _wide_statement(count)
    engine = create_engine(db_url)
    try:
        row = run_driver_transaction(engine, lambda t: t.rows(
            statement, {f"value_{index}": index * 7 for index in range(count)})[0])
        assert tuple(row) == ("100%", *(index * 7 for index in range(count)), 0)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_psycopg_parses_no_statement_at_execution(
    gate: Quotagate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statements reach psycopg numbered (``$1``): nothing to parse per execution.

    psycopg's default cursor parses ``%(name)s`` placeholders in Python at every
    execution, with no cache for a statement of more than 50 parameters, such as
    admit(16)'s outbox and audit rows (docs/performance.md).
    """
    from psycopg import _queries

    parsed: list[bytes] = []
    for name in ("_query2pg", "_query2pg_nocache"):
        original = getattr(_queries, name)
        monkeypatch.setattr(_queries, name, lambda query, encoding, original=original: (
            parsed.append(query), original(query, encoding))[1])
    gate.set_tenant("team-a", {"gpu": 100})
    gate.set_pool("pool-1", {"gpu": 100})
    for index in range(20):
        gate.submit(f"job-{index}", "team-a", {"gpu": 1})
    assert len(gate.admit(1)) == 1  # and the expiry pass, on SQLAlchemy's connection, is done
    parsed.clear()
    assert len(gate.admit(16)) == 16
    assert parsed == []
