"""Index_Expires filtered WHERE Expires IS NOT NULL (NServiceBus 3.1).

Most messages never expire: the filter keeps their rows out of the index. SQL Server rebuilds
it with DROP_EXISTING = ON (ONLINE = ON where the edition can); PostgreSQL drops it and builds
it anew CONCURRENTLY; SQLite drops and creates it.
Downgrade: the unfiltered index of 2.2.2-3.0.

Revision ID: 0003_filter_expires_index
Revises: 0002_headers_nvarchar
"""

from __future__ import annotations

from alembic import op

import sqlqueue_orm.migration.operations  # noqa: F401  (registers op.upgrade_queue_tables)

revision = "0003_filter_expires_index"
down_revision: str | None = "0002_headers_nvarchar"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.upgrade_queue_tables(revision)


def downgrade() -> None:
    op.downgrade_queue_tables(revision)
