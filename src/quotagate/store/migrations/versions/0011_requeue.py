"""requeue after preemption: per-tenant on_preempt, request attempts and token floor, holds

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-01 17:30:00
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_BINARY: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.add_column(sa.Column('on_preempt', sa.String(length=16), server_default='fail',
                                      nullable=False))
    with op.batch_alter_table('qg_request', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), server_default='1',
                                      nullable=False))
        batch_op.add_column(sa.Column('token_floor', sa.BigInteger(), server_default='0',
                                      nullable=False))
        batch_op.add_column(sa.Column('preempted_by', sa.String(length=128), nullable=True))
        batch_op.create_index(batch_op.f('ix_qg_request_preempted_by'), ['preempted_by'],
                              unique=False)
    op.create_table('qg_hold',
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('created', sa.Double(), nullable=False),
    sa.Column('expires', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('request_id', name=op.f('pk_qg_hold')),
    **_BINARY,
    )


def downgrade() -> None:
    op.drop_table('qg_hold')
    with op.batch_alter_table('qg_request', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_qg_request_preempted_by'))
        batch_op.drop_column('preempted_by')
        batch_op.drop_column('token_floor')
        batch_op.drop_column('attempt')
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.drop_column('on_preempt')
