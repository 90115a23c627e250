"""fair sharing: cohorts, borrowing and lending limits, tenant weights, maximum priority, preemption policies

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 14:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('qg_cohort',
    sa.Column('name', sa.String(length=63), nullable=False),
    sa.Column('parent', sa.String(length=63), nullable=True),
    sa.Column('created', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_qg_cohort'))
    )
    op.create_table('qg_cohort_usage',
    sa.Column('cohort', sa.String(length=63), nullable=False),
    sa.Column('resource', sa.String(length=32), nullable=False),
    sa.Column('cap', sa.BigInteger(), nullable=False),
    sa.Column('used', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('cohort', 'resource', name=op.f('pk_qg_cohort_usage'))
    )
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cohort', sa.String(length=63), nullable=True))
        batch_op.add_column(sa.Column('weight', sa.Integer(), server_default='1', nullable=False))
        batch_op.add_column(sa.Column('max_priority', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('reclaim', sa.String(length=16), server_default='never',
                                      nullable=False))
        batch_op.add_column(sa.Column('within_tenant', sa.String(length=16),
                                      server_default='never', nullable=False))
    with op.batch_alter_table('qg_tenant_quota', schema=None) as batch_op:
        batch_op.add_column(sa.Column('borrowing_limit', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('lending_limit', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('cohort_root', sa.String(length=63), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('qg_tenant_quota', schema=None) as batch_op:
        batch_op.drop_column('cohort_root')
        batch_op.drop_column('lending_limit')
        batch_op.drop_column('borrowing_limit')
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.drop_column('within_tenant')
        batch_op.drop_column('reclaim')
        batch_op.drop_column('max_priority')
        batch_op.drop_column('weight')
        batch_op.drop_column('cohort')
    op.drop_table('qg_cohort_usage')
    op.drop_table('qg_cohort')
