"""Create or migrate the schema with Alembic (``quotagate init``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from quotagate.store.dialect import raise_translated

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported only when a migration runs: every CLI command would
# otherwise pay for it at start-up.

_MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Bring the database to ``revision`` (the newest schema unless told); return where it is."""
    from alembic import command

    config = alembic_config()
    with _connected(engine) as connection, connection.begin():
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    return current_revision(engine)


def _connected(engine: Engine) -> Connection:
    # Only the connect is translated (a server down or refusing us is a clear
    # error, not a traceback); a failing migration statement stays what it is.
    try:
        return engine.connect()
    except DBAPIError as error:
        raise_translated(error)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
