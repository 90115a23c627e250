"""Throwaway databases, one per lab scenario, removed at the end.

SQLite: a fresh file in the lab's working directory. A server URL names only
the server: the lab creates a database with a unique name there, drops it at
the end and checks that it is gone; what it could not drop is reported, and
``quotagate lab`` exits non-zero.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError

from quotagate.errors import StoreUnavailable
from quotagate.store.engine import create_engine, normalise_url, redact

# Where the lab connects to create and drop its databases when the URL names none:
# databases every account may open on a stock server.
_ADMIN_DATABASE = {"postgresql": "postgres", "mysql": "information_schema"}

_EXISTS = {
    "postgresql": "SELECT count(*) FROM pg_database WHERE datname = :name",
    "mysql": "SELECT count(*) FROM information_schema.schemata WHERE schema_name = :name",
}


@dataclass
class Cleanup:
    """What became of one throwaway database."""

    database: str
    removed: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"database": self.database, "removed": self.removed, "error": self.error}


def new_run_id() -> str:
    return uuid.uuid4().hex[:10]


def server_url(base_url: str | None) -> URL | None:
    """The server the lab creates its databases on; None for SQLite (a fresh file each).

    Checked once, before any scenario runs, so a bad URL is one clear error
    rather than every scenario failing alike. The database a server URL names
    is only where the lab connects to create its own; a URL naming none
    (``postgresql://postgres@host:5432/``) connects to one every account may open.
    """
    if base_url is None:
        return None
    try:
        given = make_url(base_url)
    except ArgumentError:
        given = None
    if given is not None and not given.database:
        backend = given.drivername.partition("+")[0]
        if backend in _ADMIN_DATABASE:
            base_url = given.set(database=_ADMIN_DATABASE[backend]).render_as_string(hide_password=False)
    url = normalise_url(base_url)
    return None if url.get_backend_name() == "sqlite" else url


@contextmanager
def throwaway_database(
    url: URL | None, workdir: Path, run_id: str, label: str, cleanups: list[Cleanup]
) -> Iterator[str]:
    """Yield the URL of a new empty database on ``url`` (from :func:`server_url`), or a
    fresh SQLite file when it is None; drop it afterwards and record how that went."""
    name = f"qglab_{run_id}_{label}"
    if url is None:
        path = workdir / f"{name}.db"
        cleanup = Cleanup(str(path))
        cleanups.append(cleanup)
        try:
            yield f"sqlite:///{path}"
        finally:
            _remove_sqlite(path, cleanup)
        return
    backend = url.get_backend_name()
    admin = create_engine(url.render_as_string(hide_password=False), isolation_level="AUTOCOMMIT")
    # URL.set ignores None: _replace is how the database is taken out of the name.
    server = redact(url._replace(database=None).render_as_string(hide_password=False))
    cleanup = Cleanup(f"database {name} on {server}")
    try:
        try:
            with admin.connect() as connection:
                connection.exec_driver_sql(f"CREATE DATABASE {name}")
        except sa.exc.DBAPIError as error:
            raise StoreUnavailable(
                f"cannot create a lab database on {server}: "
                f"{str(error.orig).splitlines()[0]}; nothing was created",
                code="lab_database_unavailable",
            ) from error
        cleanups.append(cleanup)
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            _drop(admin, backend, name, cleanup)
    finally:
        admin.dispose()


def _remove_sqlite(path: Path, cleanup: Cleanup) -> None:
    try:
        for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            leftover.unlink(missing_ok=True)
        cleanup.removed = not path.exists()
    except OSError as error:
        cleanup.error = str(error)


def _drop(admin: Engine, backend: str, name: str, cleanup: Cleanup) -> None:
    force = " WITH (FORCE)" if backend == "postgresql" else ""
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
            left = connection.execute(sa.text(_EXISTS[backend]), {"name": name}).scalar_one()
        cleanup.removed = int(left) == 0
    except sa.exc.DBAPIError as error:
        cleanup.error = str(error.orig)
