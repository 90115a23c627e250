"""The sink's own tables, kept in the *business* database next to the rows it writes.

They live there, not in the ledger, because only a record committed in the same
transaction as the business rows can say truthfully which batches took effect
(docs/streaming.md). The job that writes them needs no access to the ledger.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    }
)

QUERY_NAME = sa.String(128)
REQUEST_ID = sa.String(128)

# One row per (query, batch) that took effect. ``deliveries`` counts how often the
# batch was written (a replay adds one), ``conflicts`` how many of its rows were
# already present on the business key, summed over deliveries.
batch_marker = sa.Table(
    "qg_sink_batch",
    metadata,
    sa.Column("query", QUERY_NAME, primary_key=True),
    sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("business_table", sa.String(128), nullable=False),
    sa.Column("deliveries", sa.Integer, nullable=False),
    sa.Column("rows_seen", sa.BigInteger, nullable=False),
    sa.Column("inserted", sa.BigInteger, nullable=False),
    sa.Column("conflicts", sa.BigInteger, nullable=False),
    sa.Column("last_conflicts", sa.BigInteger, nullable=False),
    sa.Column("request_id", REQUEST_ID, nullable=True),
    sa.Column("fencing_token", sa.BigInteger, nullable=True),
    sa.Column("first_written", sa.Double, nullable=False),
    sa.Column("last_written", sa.Double, nullable=False),
)

# The highest fencing token seen per request: a writer carrying a lower one is an
# older delivery attempt that a newer one has superseded.
fence = sa.Table(
    "qg_sink_fence",
    metadata,
    sa.Column("request_id", REQUEST_ID, primary_key=True),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("updated", sa.Double, nullable=False),
)
