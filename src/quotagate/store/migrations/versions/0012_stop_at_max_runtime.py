"""stop at max-runtime: per-tenant stop_at_max_runtime, indexed for the workers' check

Revision ID: 0012
Revises: 0016
Create Date: 2026-12-01 23:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Off for every existing tenant: overruns keep running, as before (decision 711).
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stop_at_max_runtime', sa.Boolean(),
                                      server_default=sa.false(), nullable=False))
        batch_op.create_index(batch_op.f('ix_qg_tenant_stop_at_max_runtime'),
                              ['stop_at_max_runtime'], unique=False)


def downgrade() -> None:
    # An older version knows neither state: a request in one would be unreadable
    # there (and a timing_out one never stopped). Prune or wait for them first.
    left = op.get_bind().execute(sa.text(
        "SELECT COUNT(*) FROM qg_request WHERE state IN ('timing_out', 'timed_out')")).scalar()
    if left:
        raise RuntimeError("requests are timing_out or timed_out: let their stops finish and "
                           "prune them (quotagate prune) before downgrading below 0012")
    with op.batch_alter_table('qg_tenant', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_qg_tenant_stop_at_max_runtime'))
        batch_op.drop_column('stop_at_max_runtime')
