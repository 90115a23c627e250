"""The Alembic migrations and schema.py describe the same schema, on every backend."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from quotagate import Quotagate
from quotagate.store.migrate import head_revision
from quotagate.store.schema import metadata


def test_init_creates_the_schema_the_code_expects(empty_db_url: str) -> None:
    with Quotagate.connect(empty_db_url) as gate:
        assert gate.init() == head_revision()
        assert gate.init() == head_revision()  # running it again is harmless
        with gate.engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), metadata)
        assert differences == []
