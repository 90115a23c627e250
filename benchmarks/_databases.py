"""Throwaway databases for benchmarks: created for one run, dropped after it.

Servers come from the environment (defaults: this machine's services), like the
test suite's. A benchmark never touches an existing database: it creates
``qgb_<random>`` on the server (or a file in a temporary directory for SQLite)
with the full schema, and drops it when done, also when interrupted.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from quotagate.store.engine import create_engine
from quotagate.store.schema import metadata

POSTGRES_URL = os.environ.get(
    "QUOTAGATE_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("QUOTAGATE_BENCH_MYSQL", "mysql://root@127.0.0.1:3306/test")
BACKENDS = ("sqlite", "postgresql", "mysql")


class ServerUnavailable(Exception):
    """The database server of a backend cannot be reached."""


def server_url(backend: str) -> str:
    if backend == "postgresql":
        return POSTGRES_URL
    if backend == "mysql":
        return MYSQL_URL
    raise ValueError(f"unknown server backend {backend!r}; expected one of {BACKENDS}")


@contextmanager
def throwaway_database(backend: str, *, create_schema: bool = True) -> Iterator[str]:
    """Yield the URL of a new empty database (with the schema unless told not to)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="quotagate-bench-") as directory:
            url = f"sqlite:///{Path(directory) / 'ledger.db'}"
            _create_schema(url, create_schema)
            yield url
        return
    server = server_url(backend)
    name = f"qgb_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError as error:
        admin.dispose()
        raise ServerUnavailable(f"{backend} at {server} is not reachable: {error.orig}") from error
    try:
        url = sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False)
        _create_schema(url, create_schema)
        yield url
    finally:
        with admin.connect() as connection:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
        admin.dispose()


def _create_schema(url: str, wanted: bool) -> None:
    if not wanted:
        return
    engine = create_engine(url)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
