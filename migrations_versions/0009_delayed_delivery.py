"""Delayed tables (``<endpoint>.Delayed``) to NServiceBus's layout: the index on Due.

Native delayed delivery stores messages in one delayed table per endpoint (columns Headers,
Body, Due, RowVersion; NServiceBus's PostgreSQL layout id, headers, body, due). Endpoints
create the table when they start; this revision gives tables that lack it (made by an older
NServiceBus or by hand) the index on Due the mover's queries need: ``Index_Due`` on SQL Server,
``"<table>_Due"`` on PostgreSQL, ``<table>_Index_Due`` on SQLite. Tables are found by their
columns in the target schemas, whatever their names (see sqlqueue_orm.migration.delayed).
Idempotent; online one line per table, offline (``--sql``) a server-side loop.

Downgrade does nothing: the index is part of NServiceBus's own layout of the table, which
.NET endpoints sharing it expect, and dropping it would only slow the movers down.

Revision ID: 0009_delayed_delivery
Revises: 0008_postgresql_nsb_layout
"""

from __future__ import annotations

from sqlqueue_orm.migration import delayed

revision = "0009_delayed_delivery"
down_revision: str | None = "0008_postgresql_nsb_layout"
branch_labels = None
depends_on = None


def upgrade() -> None:
    delayed.upgrade()


def downgrade() -> None:
    pass
