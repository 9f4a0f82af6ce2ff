"""PostgreSQL queue tables get the storage settings of a churning table.

``fillfactor=100`` (rows are only inserted and deleted: no room is kept for updates),
``autovacuum_vacuum_scale_factor=0`` and ``autovacuum_vacuum_threshold=1000`` (vacuum after a
fixed number of dead rows, not after 20% of a backlog that may hold millions) and
``autovacuum_vacuum_cost_delay=0`` (never throttled: the table is small once drained), the
settings :class:`~sqlqueue_orm.schema.QueueInstaller` gives new tables
(``dialects.postgresql.QUEUE_STORAGE``; the figure is in docs/scale.md). ``ALTER TABLE ... SET``
changes the catalog only: no row is rewritten. Idempotent, online and offline. A no-op on SQL
Server and SQLite. Downgrade resets the four settings to the server's defaults.

Revision ID: 0011_queue_storage
Revises: 0010_subscription_routing
"""

from __future__ import annotations

from alembic import op

import sqlqueue_orm.migration.operations  # noqa: F401  (registers op.upgrade_queue_tables)

revision = "0011_queue_storage"
down_revision: str | None = "0010_subscription_routing"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.upgrade_queue_tables(revision)


def downgrade() -> None:
    op.downgrade_queue_tables(revision)
