"""ledger identity and stops

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "qg_meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_qg_meta")),
    )
    with op.batch_alter_table("qg_outbox") as batch:
        batch.add_column(sa.Column("stopping", sa.Boolean(), server_default=sa.false(),
                                   nullable=False))
        batch.create_index(batch.f("ix_qg_outbox_stopping_next_attempt_at"),
                           ["stopping", "next_attempt_at"], unique=False)
    # A ledger created before this revision gets its identity here.
    op.bulk_insert(meta, [{"key": "ledger_id", "value": uuid.uuid4().hex}])


def downgrade() -> None:
    with op.batch_alter_table("qg_outbox") as batch:
        batch.drop_index(batch.f("ix_qg_outbox_stopping_next_attempt_at"))
        batch.drop_column("stopping")
    op.drop_table("qg_meta")
