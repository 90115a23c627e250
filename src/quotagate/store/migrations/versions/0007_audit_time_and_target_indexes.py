"""audit time and target indexes: the dashboard's last hour and a request's story

Revision ID: 0007
Revises: 0001
Create Date: 2026-12-01 10:10:00
"""

from __future__ import annotations

from alembic import op

revision = '0007'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('qg_audit', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_qg_audit_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_qg_audit_target'), ['target'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('qg_audit', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_qg_audit_target'))
        batch_op.drop_index(batch_op.f('ix_qg_audit_at'))
