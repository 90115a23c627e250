"""binary collation on MariaDB/MySQL: ids and names compare case-sensitively everywhere

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 14:40:00
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

# Every table schema.py defines at this revision.
TABLES = (
    'qg_tenant', 'qg_tenant_quota', 'qg_pool', 'qg_pool_capacity', 'qg_request', 'qg_outbox',
    'qg_binding', 'qg_lease', 'qg_target', 'qg_target_tenant', 'qg_audit', 'qg_api_token',
    'qg_rate_bucket', 'qg_meta', 'qg_topic', 'qg_tenant_stream', 'qg_cohort', 'qg_cohort_usage',
)


def _convert(collation: str) -> None:
    # SQLite and PostgreSQL already compare text byte for byte.
    if op.get_bind().dialect.name not in ('mysql', 'mariadb'):
        return
    for table in TABLES:
        op.execute(f'ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}')


def upgrade() -> None:
    _convert('utf8mb4_bin')


def downgrade() -> None:
    # The server's usual default; the one the tables had before is not recorded.
    _convert('utf8mb4_general_ci')
