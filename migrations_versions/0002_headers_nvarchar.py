"""Headers to nvarchar(max) NOT NULL (text on PostgreSQL and SQLite) on every queue table.

varchar Headers (NServiceBus.SqlServer before 2.2.6 / 3.0.3 / 3.1.1) lose every character
outside the column's code page. varchar -> nvarchar maps each stored character to Unicode, so
none is lost; on SQL Server it rewrites every row (size-of-data, Sch-M lock for its duration).
PostgreSQL: varchar -> text is binary coercible (no rewrite). SQLite: the declared type only
changes by rebuilding the table (copy, same RowVersions).
Downgrade: back to varchar(max) / varchar; SQL Server refuses (THROW, nothing changed) when a
row holds a character varchar cannot store.

Revision ID: 0002_headers_nvarchar
Revises: 0001_expires_index
"""

from __future__ import annotations

from alembic import op

import sqlqueue_orm.migration.operations  # noqa: F401  (registers op.upgrade_queue_tables)

revision = "0002_headers_nvarchar"
down_revision: str | None = "0001_expires_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.upgrade_queue_tables(revision)


def downgrade() -> None:
    op.downgrade_queue_tables(revision)
