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

from sqlqueue_orm.models.ddl import compile_ddl

# The per-dialect branches left here (dialect.name == ...) are migration-time step dispatch and
# DDL; they move when migration/ becomes a class per dialect (issue 8, item 5). Run-time
# statements and catalog queries live in sqlqueue_orm.dialects.


def _literal(text: str) -> str:
    return "N'" + text.replace("'", "''") + "'"


def create_table_if_missing(name: str, *elements: sa.schema.SchemaItem) -> None:
    """Create table *name* with *elements* (columns, constraints) unless it exists."""
    context = op.get_context()
    if not context.as_sql:
        if not sa.inspect(op.get_bind()).has_table(name):
            op.create_table(name, *elements)
        return
    dialect = context.dialect
    if dialect.name != "mssql":
        op.create_table(name, *elements, if_not_exists=True)
        return
    table = sa.Table(name, sa.MetaData(), *elements)
    create = compile_ddl(sa.schema.CreateTable(table), dialect)
    quoted = dialect.identifier_preparer.format_table(table)
    op.execute(f"IF OBJECT_ID({_literal(quoted)}, N'U') IS NULL\nBEGIN\n{create}\nEND")


def create_index_if_missing(name: str, table: str, columns: Sequence[str], **kwargs: Any) -> None:
    """Create index *name* on *table* unless the table already has an index of that name."""
    context = op.get_context()
    if not context.as_sql:
        existing = {str(index["name"]) for index in sa.inspect(op.get_bind()).get_indexes(table)}
        if name not in existing:
            op.create_index(name, table, list(columns), **kwargs)
        return
    dialect = context.dialect
    if dialect.name != "mssql":
        op.create_index(name, table, list(columns), if_not_exists=True, **kwargs)
        return
    model = sa.Table(table, sa.MetaData(), *(sa.Column(column) for column in columns))
    index = sa.Index(name, *(model.c[column] for column in columns), **kwargs)
    create = compile_ddl(sa.schema.CreateIndex(index), dialect)
    quoted = dialect.identifier_preparer.format_table(model)
    # A filtered index needs these SET options in the session that creates it.
    options = "SET ANSI_NULLS, QUOTED_IDENTIFIER ON;\n" if "WHERE" in create else ""
    op.execute(
        f"{options}IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = {_literal(name)} "
        f"AND object_id = OBJECT_ID({_literal(quoted)}))\n{create}"
    )
