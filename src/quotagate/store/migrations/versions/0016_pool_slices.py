"""capacity slices: qg_pool_capacity rows per (pool, slice, resource); a request records its slice

Revision ID: 0016
Revises: 0011
Create Date: 2026-12-01 17:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every existing row becomes slice 0 of its pool: one slice, today's behaviour.
    with op.batch_alter_table('qg_pool_capacity', schema=None) as batch_op:
        batch_op.add_column(sa.Column('slice', sa.Integer(), server_default='0', nullable=False))
        batch_op.drop_constraint('pk_qg_pool_capacity', type_='primary')
        batch_op.create_primary_key('pk_qg_pool_capacity', ['pool', 'slice', 'resource'])
    with op.batch_alter_table('qg_request', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pool_slice', sa.Integer(), nullable=True))


def downgrade() -> None:
    # Only a ledger whose pools all have one slice again can go back: folding
    # slices into one row here would be a second, untested copy of the S change.
    sliced = op.get_bind().execute(
        sa.text('SELECT COUNT(*) FROM qg_pool_capacity WHERE slice <> 0')).scalar()
    if sliced:
        raise RuntimeError("set every pool to one slice (quotagate pool set P --slices 1) "
                           "before downgrading below 0016")
    with op.batch_alter_table('qg_request', schema=None) as batch_op:
        batch_op.drop_column('pool_slice')
    with op.batch_alter_table('qg_pool_capacity', schema=None) as batch_op:
        batch_op.drop_constraint('pk_qg_pool_capacity', type_='primary')
        batch_op.create_primary_key('pk_qg_pool_capacity', ['pool', 'resource'])
        batch_op.drop_column('slice')
