"""Creating the shared tables (OutboxData, SparkSendLedger, ...) idempotently, online and offline.

Online, the database is inspected and only what is missing is created. Offline (``--sql``) the
script must be safe to run twice as well, so each statement is guarded on the server:
``IF NOT EXISTS`` on PostgreSQL and SQLite, ``IF OBJECT_ID(...) IS NULL`` / ``IF NOT EXISTS
(SELECT 1 FROM sys.indexes ...)`` on SQL Server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from sqlqueue_orm.migration import impl


def create_table_if_missing(name: str, *elements: sa.schema.SchemaItem, **kwargs: Any) -> None:
    """Create table *name* with *elements* (columns, constraints) unless it exists.

    :param kwargs: dialect options of the table (``postgresql_with=...``).
    """
    context = op.get_context()
    if not context.as_sql:
        if not sa.inspect(op.get_bind()).has_table(name):
            op.create_table(name, *elements, **kwargs)
        return
    guarded = impl.impl_for(context.dialect).guarded_create_table(context.dialect, name, elements)
    if guarded is None:
        op.create_table(name, *elements, if_not_exists=True, **kwargs)
    else:
        op.execute(guarded)


def create_index_if_missing(name: str, table: str, columns: Sequence[str], **kwargs: Any) -> None:
    """Create index *name* on *table* unless the table already has an index of that name."""
    context = op.get_context()
    if not context.as_sql:
        existing = {str(index["name"]) for index in sa.inspect(op.get_bind()).get_indexes(table)}
        if name not in existing:
            op.create_index(name, table, list(columns), **kwargs)
        return
    guarded = impl.impl_for(context.dialect).guarded_create_index(
        context.dialect, name, table, columns, kwargs
    )
    if guarded is None:
        op.create_index(name, table, list(columns), if_not_exists=True, **kwargs)
    else:
        op.execute(guarded)
