"""The Alembic migrations and schema.py describe the same schema, on every backend."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from quotagate import Quotagate
from quotagate.store import schema
from quotagate.store.migrate import head_revision, upgrade
from quotagate.store.schema import metadata


def test_init_creates_the_schema_the_code_expects(empty_db_url: str) -> None:
    with Quotagate.connect(empty_db_url) as gate:
        assert gate.init() == head_revision()
        assert gate.init() == head_revision()  # running it again is harmless
        with gate.engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), metadata)
        assert differences == []


def test_upgrading_to_binary_collation_keeps_rows_and_makes_ids_case_sensitive(
    empty_db_url: str,
) -> None:
    """Migration 0009 on a ledger made at 0007: the rows stay, lookups become exact."""
    with Quotagate.connect(empty_db_url) as gate:
        upgrade(gate.engine, "0007")
        with gate.engine.begin() as connection:
            connection.execute(schema.tenant.insert().values(name="team-a", created=1.0))
        gate.init()
        with gate.engine.connect() as connection:
            names = connection.execute(
                sa.select(schema.tenant.c.name).where(schema.tenant.c.name == "TEAM-A")).all()
            kept = connection.execute(sa.select(schema.tenant.c.name)).scalars().all()
            if gate.engine.dialect.name in ("mysql", "mariadb"):
                collations = set(connection.execute(sa.text(
                    "SELECT DISTINCT collation_name FROM information_schema.columns "
                    "WHERE table_schema = DATABASE() AND table_name LIKE 'qg\\_%' "
                    "AND collation_name IS NOT NULL"
                )).scalars())
                assert collations == {"utf8mb4_bin"}
    assert kept == ["team-a"]
    assert names == []


def test_the_grace_migration_goes_down_and_up_again(empty_db_url: str) -> None:
    """Migration 0013 adds the tenant's max_runtime_grace (0 for every tenant) and its
    downgrade drops only that setting."""
    from alembic import command

    from quotagate.store.migrate import alembic_config, current_revision

    with Quotagate.connect(empty_db_url) as gate:
        upgrade(gate.engine, "0012")
        with gate.engine.begin() as connection:
            connection.execute(schema.tenant.insert().values(name="team-a", created=1.0))
        assert upgrade(gate.engine, "0013") == "0013"
        gate.set_tenant("team-a", {}, stop_at_max_runtime=True, max_runtime_grace=60)
        config = alembic_config()
        with gate.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0012")
        assert current_revision(gate.engine) == "0012"
        columns = {column["name"] for column in sa.inspect(gate.engine).get_columns("qg_tenant")}
        assert "max_runtime_grace" not in columns and "stop_at_max_runtime" in columns
        gate.init()
        assert gate.tenant("team-a")["max_runtime_grace"] == 0
        assert gate.tenant("team-a")["stop_at_max_runtime"] is True


def test_the_claimable_index_migration_goes_down_and_up_again(empty_db_url: str) -> None:
    """Migration 0014 replaces the outbox's ``(delivered, next_attempt_at)`` and
    ``(stopping, next_attempt_at)`` indexes by two that lead with both flags and end with
    the claimable read's order (docs/decisions/257); its downgrade puts the old ones back.
    The rows stay."""
    from alembic import command

    from quotagate.store.migrate import alembic_config, current_revision

    def outbox_indexes() -> set[tuple[str, ...]]:
        return {tuple(index["column_names"])  # type: ignore[arg-type]
                for index in sa.inspect(gate.engine).get_indexes("qg_outbox")}

    old, new = {("delivered", "next_attempt_at"), ("stopping", "next_attempt_at")}, {
        ("delivered", "stopping", "next_attempt_at", "request_id"),
        ("stopping", "delivered", "next_attempt_at", "request_id")}
    with Quotagate.connect(empty_db_url) as gate:
        upgrade(gate.engine, "0013")
        assert old <= outbox_indexes() and not new & outbox_indexes()
        gate.set_pool("main", {"gpu": 4})
        gate.set_tenant("team-a", {"gpu": 4})
        gate.submit("r-1", "team-a", {"gpu": 1})
        assert len(gate.admit(1)) == 1
        assert upgrade(gate.engine, "0014") == "0014"
        assert new <= outbox_indexes() and not old & outbox_indexes()
        config = alembic_config()
        with gate.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0013")
        assert current_revision(gate.engine) == "0013"
        assert old <= outbox_indexes() and not new & outbox_indexes()
        gate.init()
        assert new <= outbox_indexes()
        assert gate.show("r-1").state.value == "reserved"
        assert gate.check_invariants() == []


def test_the_stop_progress_migration_goes_down_and_up_again(empty_db_url: str) -> None:
    """Migration 0015 adds the outbox's ``stop_progress`` (NULL for every row; decision 823)
    and its downgrade drops only that column. The rows stay."""
    from alembic import command

    from quotagate.store.migrate import alembic_config, current_revision

    def outbox_columns() -> set[str]:
        return {column["name"] for column in sa.inspect(gate.engine).get_columns("qg_outbox")}

    with Quotagate.connect(empty_db_url) as gate:
        upgrade(gate.engine, "0014")
        assert "stop_progress" not in outbox_columns()
        gate.set_pool("main", {"gpu": 4})
        gate.set_tenant("team-a", {"gpu": 4})
        gate.submit("r-1", "team-a", {"gpu": 1})
        assert len(gate.admit(1)) == 1
        assert upgrade(gate.engine, "0015") == "0015"
        assert "stop_progress" in outbox_columns()
        config = alembic_config()
        with gate.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0014")
        assert current_revision(gate.engine) == "0014"
        assert "stop_progress" not in outbox_columns()
        gate.init()
        assert gate.request_story("r-1")["delivery"]["stop_progress"] is None
        assert gate.check_invariants() == []
