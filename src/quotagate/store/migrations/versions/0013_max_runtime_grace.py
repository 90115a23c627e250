"""max-runtime grace: per-tenant seconds past the max-runtime before its stop begins

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 05:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # 0 for every existing tenant: stops begin at the max-runtime, as before (decision 714).
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_runtime_grace', sa.Integer(), server_default='0',
                                      nullable=False))


def downgrade() -> None:
    # Only a setting goes: stops already begun finish; later ones begin at the max-runtime.
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.drop_column('max_runtime_grace')
