"""stop progress: a stop's answer while under way, apart from the outbox's last error

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 19:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every existing row: a stop under way when this runs keeps its answer in
    # last_error until its next poll writes it here and clears last_error (decision 823).
    with op.batch_alter_table('qg_outbox', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stop_progress', sa.String(length=2048), nullable=True))


def downgrade() -> None:
    # Only the answers of stops under way go; the stops themselves go on.
    with op.batch_alter_table('qg_outbox', schema=None) as batch_op:
        batch_op.drop_column('stop_progress')
