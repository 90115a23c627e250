"""The ledger's own identity: an id given at ``init`` and kept in the database.

It goes into every external object a worker creates and into the hash of the
object's name, so two ledgers delivering into one place (a shared run
directory, one webhook receiver, one namespace) never adopt each other's
objects (docs/decisions/210).
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from quotagate.store import schema

LEDGER_ID_KEY = "ledger_id"


def ledger_id(engine: Engine) -> str:
    """The ledger's id; created on first use when the migration did not (a race is harmless)."""
    query = sa.select(schema.ledger_meta.c.value).where(
        schema.ledger_meta.c.key == LEDGER_ID_KEY
    )
    with engine.connect() as connection:
        found = connection.execute(query).scalar_one_or_none()
    if found is not None:
        return str(found)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.insert(schema.ledger_meta).values(key=LEDGER_ID_KEY, value=uuid.uuid4().hex)
            )
    except IntegrityError:
        pass  # another process created it first: read theirs
    with engine.connect() as connection:
        return str(connection.execute(query).scalar_one())
