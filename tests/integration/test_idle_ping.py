"""Pooled connections are pinged only after sitting idle (docs/decisions/312-*).

A connection the server dropped while it sat in the pool is replaced at
checkout, before any statement uses it; one back in the pool within the idle
window is handed out without a ping (so a drop inside that window fails one
statement, which is what the window trades for one round trip less).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate.store import engine as engine_module
from quotagate.store.engine import create_engine
from support.databases import fresh_database

_PID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
_KILL = {"postgresql": "SELECT pg_terminate_backend({pid})", "mysql": "KILL {pid}"}


def _drop_pooled_connection(url: str, backend: str) -> tuple[sa.Engine, int]:
    """An engine whose one pooled connection the server has since killed."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    with engine.connect() as connection:
        pid = int(connection.exec_driver_sql(_PID[backend]).scalar_one())
    killer = create_engine(url, poolclass=sa.pool.NullPool)
    with killer.connect() as connection:
        connection.exec_driver_sql(_KILL[backend].format(pid=pid))
        connection.commit()
    killer.dispose()
    return engine, pid


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgresql),
                                     pytest.param("mysql", marks=pytest.mark.mysql)])
def test_a_connection_dropped_while_idle_is_replaced_before_use(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fresh_database(backend, tmp_path, create_schema=False) as url:
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)  # every return counts as idle
        engine, killed = _drop_pooled_connection(url, backend)
        try:
            with engine.connect() as connection:
                assert int(connection.exec_driver_sql(_PID[backend]).scalar_one()) != killed
        finally:
            engine.dispose()


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgresql),
                                     pytest.param("mysql", marks=pytest.mark.mysql)])
def test_a_connection_just_returned_is_not_pinged(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fresh_database(backend, tmp_path, create_schema=False) as url:
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 3600.0)
        engine, _killed = _drop_pooled_connection(url, backend)
        try:
            # No ping: the dead connection is used, fails once, and the pool is renewed.
            with pytest.raises(sa.exc.DBAPIError) as failed, engine.connect() as connection:
                connection.exec_driver_sql(_PID[backend]).scalar_one()
            assert failed.value.connection_invalidated
            with engine.connect() as connection:
                assert connection.exec_driver_sql("SELECT 1").scalar_one() == 1
        finally:
            engine.dispose()
