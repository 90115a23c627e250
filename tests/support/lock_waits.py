"""How many transactions of a database wait for a row lock right now (PostgreSQL, MariaDB)."""

from __future__ import annotations

import sqlalchemy as sa

# InnoDB answers information_schema.innodb_trx from a cache it refreshes only when
# the cache has not been read for 0.1 s: polling faster would see it stale forever.
LOCK_POLL_SECONDS = 0.2


def lock_waiters(engine: sa.Engine) -> int:
    """Transactions of this database waiting for a row lock right now."""
    if engine.dialect.name == "postgresql":
        query = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                 "AND datname = current_database()")
    else:
        query = "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
    # A connection of its own each time: PostgreSQL keeps one activity snapshot per transaction.
    with engine.connect() as connection:
        return int(connection.exec_driver_sql(query).scalar_one())
