"""budgets: resource-hours per rolling window, max-runtime, admission time; decayed past use

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 17:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None



def upgrade() -> None:
    op.create_table('qg_tenant_budget',
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('resource', sa.String(length=32), nullable=False),
    sa.Column('amount', sa.BigInteger(), nullable=False),
    sa.Column('window_length', sa.BigInteger(), nullable=False),
    sa.Column('reserved', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('accrued', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'resource', name=op.f('pk_qg_tenant_budget')),
    mysql_charset='utf8mb4', mysql_collate='utf8mb4_bin',
    )
    op.create_table('qg_budget_usage',
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('resource', sa.String(length=32), nullable=False),
    sa.Column('bucket', sa.BigInteger(), nullable=False),
    sa.Column('amount', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'resource', 'bucket', name=op.f('pk_qg_budget_usage')),
    mysql_charset='utf8mb4', mysql_collate='utf8mb4_bin',
    )
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.add_column(sa.Column('default_max_runtime', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('qg_tenant_quota', schema=None) as batch_op:
        batch_op.add_column(sa.Column('decayed', sa.Double(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('decayed_at', sa.Double(), nullable=True))
    with op.batch_alter_table('qg_request', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_runtime', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('reserved_runtime', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('admitted', sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('qg_request', schema=None) as batch_op:
        batch_op.drop_column('admitted')
        batch_op.drop_column('reserved_runtime')
        batch_op.drop_column('max_runtime')
    with op.batch_alter_table('qg_tenant_quota', schema=None) as batch_op:
        batch_op.drop_column('decayed_at')
        batch_op.drop_column('decayed')
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.drop_column('default_max_runtime')
    op.drop_table('qg_budget_usage')
    op.drop_table('qg_tenant_budget')
