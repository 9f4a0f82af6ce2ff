"""PostgreSQL queue tables to NServiceBus's PostgreSQL layout: id, expires, headers, body, seq.

The layout NServiceBus.Transport.PostgreSql creates (``PostgreSqlConstants.CreateQueueText``):
``id uuid PRIMARY KEY, expires timestamp, headers text NOT NULL, body bytea, seq ... UNIQUE``,
unquoted so lower case. Per table, in one transaction under ACCESS EXCLUSIVE: the columns are
renamed (catalog only: no row is rewritten, so every message keeps its bytes and its seq, the
old RowVersion, so FIFO order is kept); Recoverable is dropped; CorrelationId and ReplyToAddress
are dropped when empty, else kept as nullable ``correlationid``/``replytoaddress``; the primary
key on id and the unique seq are built (these scan the table once); Index_RowVersion is dropped
(the unique seq serves the order); ``Index_Expires`` follows the renames. Refused, naming the
table, when two rows share an Id. Idempotent; a table already in the layout is left alone.
Online (``sqlqueue migrate``) and offline (``--sql``: named tables, or a server-side loop over
the queue tables of the schemas). A no-op on SQL Server and SQLite.

Downgrade: the SQL Server column layout again (``"Id"`` ... ``"RowVersion"``, CorrelationId and
ReplyToAddress back or re-added empty, Recoverable re-added as true, Index_RowVersion rebuilt);
re-added columns come last.

Revision ID: 0008_postgresql_nsb_layout
Revises: 0007_outbox_delivery
"""

from __future__ import annotations

from alembic import op

import sqlqueue_orm.migration.operations  # noqa: F401  (registers op.upgrade_queue_tables)

revision = "0008_postgresql_nsb_layout"
down_revision: str | None = "0007_outbox_delivery"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.upgrade_queue_tables(revision)


def downgrade() -> None:
    op.downgrade_queue_tables(revision)
