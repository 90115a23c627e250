"""claimable indexes: the delivery claim's filter and order in one outbox index, both flags first

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 01:30:00
"""

from __future__ import annotations

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Each new index leads with the old one's first column, so nothing that read an old
    # one loses its index (docs/decisions/257).
    with op.batch_alter_table('qg_outbox', schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f('ix_qg_outbox_delivered_stopping_next_attempt_at_request_id'),
            ['delivered', 'stopping', 'next_attempt_at', 'request_id'], unique=False)
        batch_op.create_index(
            batch_op.f('ix_qg_outbox_stopping_delivered_next_attempt_at_request_id'),
            ['stopping', 'delivered', 'next_attempt_at', 'request_id'], unique=False)
        batch_op.drop_index(batch_op.f('ix_qg_outbox_delivered_next_attempt_at'))
        batch_op.drop_index(batch_op.f('ix_qg_outbox_stopping_next_attempt_at'))


def downgrade() -> None:
    with op.batch_alter_table('qg_outbox', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_qg_outbox_delivered_next_attempt_at'),
                              ['delivered', 'next_attempt_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_qg_outbox_stopping_next_attempt_at'),
                              ['stopping', 'next_attempt_at'], unique=False)
        batch_op.drop_index(
            batch_op.f('ix_qg_outbox_delivered_stopping_next_attempt_at_request_id'))
        batch_op.drop_index(
            batch_op.f('ix_qg_outbox_stopping_delivered_next_attempt_at_request_id'))
