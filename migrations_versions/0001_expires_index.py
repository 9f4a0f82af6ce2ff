"""Index_Expires (Expires) INCLUDE (Id, RowVersion) on every queue table (NServiceBus 2.2.2).

Tables created by NServiceBus.SqlServer 1.x-2.2.1 have no Expires index, so purging and
receiving expired messages scan the table. An index on (Expires) alone under another name is
renamed (SQLite: dropped and rebuilt); a missing one is built in the current form, filtered
WHERE Expires IS NOT NULL (so 0003 has nothing left to do for it). SQL Server builds it with
ONLINE = ON where the edition can, PostgreSQL with CREATE INDEX CONCURRENTLY.
Downgrade: drop Index_Expires.

Revision ID: 0001_expires_index
Revises:
"""

from __future__ import annotations

from alembic import op

import sqlqueue_orm.migration.operations  # noqa: F401  (registers op.upgrade_queue_tables)

revision = "0001_expires_index"
down_revision: str | None = None
branch_labels = ("sqlqueue_orm",)
depends_on = None


def upgrade() -> None:
    op.upgrade_queue_tables(revision)


def downgrade() -> None:
    op.downgrade_queue_tables(revision)
