"""Real test databases: a fresh, empty database per test on each backend.

Servers come from the environment (defaults: this machine's services). A
server that cannot be reached skips its tests with a clear message, unless
``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from quotagate.store.engine import create_engine
from quotagate.store.schema import metadata

POSTGRES_URL = os.environ.get("QUOTAGATE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("QUOTAGATE_TEST_MYSQL", "mysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("QUOTAGATE_TEST_REDIS", "redis://127.0.0.1:6379/0")
BACKENDS = ("sqlite", "postgresql", "mysql")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(what: str, error: Exception) -> None:
    message = f"{what} is not reachable ({type(error).__name__}: {error}); start it to run these tests"
    if in_ci():
        pytest.fail(f"CI=true: {message}", pytrace=False)
    pytest.skip(message)


def _server_url(backend: str) -> str:
    return POSTGRES_URL if backend == "postgresql" else MYSQL_URL


@contextmanager
def fresh_database(backend: str, tmp_path: Path, *, create_schema: bool = True) -> Iterator[str]:
    """Yield the URL of a new empty database (with the schema unless told not to)."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        server = _server_url(backend)
        name = f"qgt_{uuid.uuid4().hex[:12]}"
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as connection:
                connection.exec_driver_sql(f"CREATE DATABASE {name}")
        except sa.exc.OperationalError as error:
            admin.dispose()
            unavailable(backend, error)
        url = str(sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False))
    if create_schema:
        engine = create_engine(url)
        metadata.create_all(engine)
        engine.dispose()
    try:
        yield url
    finally:
        if backend != "sqlite":
            with admin.connect() as connection:
                if backend == "postgresql":
                    connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                else:
                    connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            admin.dispose()
