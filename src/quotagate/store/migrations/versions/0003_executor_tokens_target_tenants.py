"""executor tokens and targets limited to tenants

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('qg_api_token', schema=None) as batch_op:
        batch_op.add_column(sa.Column('executor_target', sa.String(length=63), nullable=True))
    op.create_table('qg_target_tenant',
    sa.Column('target', sa.String(length=63), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.PrimaryKeyConstraint('target', 'tenant', name=op.f('pk_qg_target_tenant'))
    )


def downgrade() -> None:
    op.drop_table('qg_target_tenant')
    with op.batch_alter_table('qg_api_token', schema=None) as batch_op:
        batch_op.drop_column('executor_target')
