"""streams: topics and per-tenant stream settings

Revision ID: 0004
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('qg_topic',
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('partitions', sa.Integer(), nullable=False),
    sa.Column('parallelism', sa.Integer(), nullable=False),
    sa.Column('max_len', sa.BigInteger(), nullable=True),
    sa.Column('created', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('tenant', 'name', name=op.f('pk_qg_topic'))
    )
    op.create_table('qg_tenant_stream',
    sa.Column('tenant', sa.String(length=63), nullable=False),
    sa.Column('max_len', sa.BigInteger(), nullable=True),
    sa.Column('max_in_flight', sa.BigInteger(), nullable=True),
    sa.Column('redis_url', sa.String(length=512), nullable=True),
    sa.PrimaryKeyConstraint('tenant', name=op.f('pk_qg_tenant_stream'))
    )


def downgrade() -> None:
    op.drop_table('qg_tenant_stream')
    op.drop_table('qg_topic')
