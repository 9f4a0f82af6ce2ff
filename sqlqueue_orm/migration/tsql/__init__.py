"""T-SQL of the queue table steps: one guarded batch per named table, or a server-side loop.

Every batch reads the table's state from ``sys.indexes`` / ``sys.index_columns`` /
``sys.columns`` before acting, so it is idempotent, and runs each table in its own transaction
under ``SET XACT_ABORT ON`` (and the SET options filtered indexes need, which ``sqlcmd`` does not
start with). Online ``sqlqueue migrate`` runs the very same batches, so what a DBA
reads is what runs. Index builds use ``ONLINE = ON`` when the edition has it
(``SERVERPROPERTY('EngineEdition')`` 3 = Enterprise/Developer, 5 = Azure SQL Database,
8 = Managed Instance). ``OPTIMIZE_FOR_SEQUENTIAL_KEY`` (SQL Server 2019+) is set through dynamic
SQL after checking ``sys.indexes`` has the column, because older servers cannot even parse it.

Named batches carry the table's name in each statement; the looping batch finds queue tables
itself (a cursor over ``sys.tables`` checking the column signature) and runs the statements with
``QUOTENAME`` and ``sp_executesql``. Table names reach the text only quoted by SQLAlchemy's mssql
dialect (identifiers) or as ``N'...'`` literals it renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, exceptions
from sqlqueue_orm.migration import impl, steps
from sqlqueue_orm.migration.tsql import bodies
from sqlqueue_orm.migration.tsql.text import (
    Lines,
    Target,
    comment,
    dialect,
    if_block,
    in_list,
    indented,
    signature_count,
)
from sqlqueue_orm.queuing import sql as queue_sql

#: Editions with online index operations: Enterprise/Developer, Azure SQL DB, Managed Instance.
ONLINE_EDITIONS = "3, 5, 8"

#: Filtered indexes need these session settings (sqlcmd starts with QUOTED_IDENTIFIER OFF);
#: NOCOUNT keeps row counts from hiding a later error from the driver.
_SETTINGS = (
    "SET NOCOUNT ON; SET XACT_ABORT ON; SET NUMERIC_ROUNDABORT OFF;\n"
    "SET ANSI_PADDING, ANSI_WARNINGS, CONCAT_NULL_YIELDS_NULL, ARITHABORT, QUOTED_IDENTIFIER, "
    "ANSI_NULLS ON;"
)
_VARIABLES = (
    "DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) "
    f"IN ({ONLINE_EDITIONS}) THEN 1 ELSE 0 END;"
)
_SCHEMAS = steps.SchemaFilter("s.name IN {}", "s.name = SCHEMA_NAME()", "the default schema")
_WORK_VARIABLES = "DECLARE @index sysname, @sql nvarchar(max), @message nvarchar(2048), @flag bit;"


def _transaction(body: Lines) -> Lines:
    return ["BEGIN TRANSACTION;", *body, "COMMIT TRANSACTION;"]


def table_batch(
    revision: str,
    direction: str,
    address: addressing.QueueAddress,
    cluster_heaps: bool = False,
) -> str:
    """The batch applying step *revision* in *direction* to the queue table at *address*.

    :param cluster_heaps: rebuild a heap (NServiceBus 8+ layout) with a clustered
        Index_RowVersion; by default a heap is kept.
    """
    step = steps.step(revision, direction)
    target = Target(_IMPL, dialect(), address, cluster_heaps)
    body: Lines = _IMPL.body(revision, direction)(target)
    skip = [f"PRINT N'queue ' + {target.name} + N': no queue table there; skipped';"]
    lines = [
        f"-- queue {comment(str(address))}: {step.describe(direction)}",
        _SETTINGS,
        f"DECLARE @object_id int = OBJECT_ID({target.name}, N'U');",
        _VARIABLES,
        _WORK_VARIABLES,
        *if_block(
            f"@object_id IS NULL OR {signature_count(target, '@object_id')} < "
            f"{len(steps.SIGNATURE)}",
            skip,
            _transaction(body),
        ),
    ]
    return "\n".join(lines)


def loop_batch(
    revision: str,
    direction: str,
    schemas: Sequence[str | None],
    cluster_heaps: bool = False,
) -> str:
    """The batch applying step *revision* in *direction* to every queue table in *schemas*.

    ``None`` in *schemas* stands for the default schema of the user running the script;
    *cluster_heaps* as in :func:`table_batch`.
    """
    step = steps.step(revision, direction)
    target = Target(_IMPL, dialect(), None, cluster_heaps)
    body: Lines = _IMPL.body(revision, direction)(target)
    where, described = _SCHEMAS.select(schemas, partial(in_list, target), target.quote)
    fetch = "FETCH NEXT FROM queue_tables INTO @object_id, @table;"
    lines = [
        f"-- every queue table in {comment(described)}: {step.describe(direction)}",
        _SETTINGS,
        "DECLARE @object_id int, @table nvarchar(517);",
        _VARIABLES,
        _WORK_VARIABLES,
        "DECLARE queue_tables CURSOR LOCAL STATIC READ_ONLY FOR",
        "    SELECT t.object_id, QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)",
        "    FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id",
        f"    WHERE t.is_ms_shipped = 0 AND ({where})",
        f"        AND {signature_count(target, 't.object_id')} = {len(steps.SIGNATURE)}",
        "    ORDER BY s.name, t.name;",
        "OPEN queue_tables;",
        fetch,
        "WHILE @@FETCH_STATUS = 0",
        "BEGIN",
        *indented(
            [
                f"PRINT N'queue ' + @table + N': {step.revision} {direction}';",
                *_transaction(body),
                fetch,
            ]
        ),
        "END",
        "CLOSE queue_tables;",
        "DEALLOCATE queue_tables",
    ]
    return "\n".join(lines)


def _n_literal(text: str) -> str:
    return "N'" + text.replace("'", "''") + "'"


def delayed_index_batch(schemas: Sequence[str | None]) -> str:
    """The batch creating the missing index on Due of the delayed tables of *schemas*.

    ``Index_Due`` (NServiceBus's CreateDelayedMessageStoreText: NONCLUSTERED on [Due]).

    A delayed table: ``Headers, Body, Due, RowVersion`` and no ``Expires``. Safe to run twice.
    """
    target = Target(_IMPL, dialect(), None)
    where, described = _SCHEMAS.select(schemas, partial(in_list, target), target.quote)
    signature = ("Headers", "Body", "Due", "RowVersion")
    fetch = "FETCH NEXT FROM delayed_tables INTO @table;"
    lines = [
        f"-- every delayed table in {comment(described)}: create its index on Due",
        "DECLARE @table nvarchar(517), @sql nvarchar(max);",
        "DECLARE delayed_tables CURSOR LOCAL STATIC READ_ONLY FOR",
        "    SELECT QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)",
        "    FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id",
        f"    WHERE t.is_ms_shipped = 0 AND ({where})",
        "        AND (SELECT COUNT(*) FROM sys.columns AS c WHERE c.object_id = t.object_id "
        f"AND c.name IN {in_list(target, signature)}) = {len(signature)}",
        "        AND NOT EXISTS (SELECT 1 FROM sys.columns AS c WHERE c.object_id = t.object_id "
        "AND c.name = N'Expires')",
        "        AND NOT EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE ic.object_id = t.object_id AND ic.key_ordinal = 1 AND c.name = N'Due')",
        "    ORDER BY s.name, t.name;",
        "OPEN delayed_tables;",
        fetch,
        "WHILE @@FETCH_STATUS = 0",
        "BEGIN",
        *indented(
            [
                "PRINT N'delayed table ' + @table + N': 0009_delayed_delivery upgrade';",
                "SET @sql = N'CREATE NONCLUSTERED INDEX [Index_Due] ON ' + @table + N' ([Due])';",
                "EXEC sp_executesql @sql;",
                fetch,
            ]
        ),
        "END",
        "CLOSE delayed_tables;",
        "DEALLOCATE delayed_tables",
    ]
    return "\n".join(lines)


class MssqlImpl(impl.QueueTableImpl):
    """SQL Server: guarded T-SQL batches, one per table and step, the same online and offline."""

    __dialect__ = "mssql"
    offline = True

    # The step bodies, one function per step of steps.STEPS and direction.
    bodies = bodies

    # -- the interface -------------------------------------------------------------------------
    def index_options(self, options: Any, variant: impl.IndexVariant) -> dict[str, Any]:
        """``mssql_clustered`` / ``_include`` / ``_where`` / ``_with`` of an index variant."""
        return {
            "mssql_clustered": (
                options["clustered"] if variant.clustered is None else variant.clustered
            ),
            "mssql_include": options["include"],
            "mssql_where": options["where"] if variant.where else None,
            "mssql_with": variant.with_options or None,
        }

    def table_statements(
        self, revision: str, direction: str, address: addressing.QueueAddress
    ) -> list[str]:
        """One batch: :func:`table_batch`."""
        return [table_batch(revision, direction, address, self.cluster_heaps)]

    def delayed_index_loop(self, schemas: Sequence[str | None]) -> str | None:
        """One batch: :func:`delayed_index_batch`."""
        return delayed_index_batch(schemas)

    def loop_statements(
        self, revision: str, direction: str, schemas: Sequence[str | None]
    ) -> list[str]:
        """One batch: :func:`loop_batch`."""
        return [loop_batch(revision, direction, schemas, self.cluster_heaps)]

    def execute(
        self, connection: Connection, statements: Sequence[str], address: addressing.QueueAddress
    ) -> None:
        """Run each T-SQL batch on the raw cursor, draining every result so no error hides."""
        dbapi_error = connection.dialect.loaded_dbapi.Error
        for batch in statements:
            cursor = connection.connection.cursor()
            try:
                cursor.execute(batch)
                while cursor.nextset():
                    pass
            except dbapi_error as error:
                raise exceptions.DatabaseError(f"queue {str(address)!r}: {error}") from error
            finally:
                cursor.close()

    def layout(self, connection: Connection, address: addressing.QueueAddress) -> impl.Layout:
        """Each column's type, and every column of ``sys.indexes``.

        Whatever the server version has: 2019+ adds ``optimize_for_sequential_key``, which 0004
        sets.
        """
        table = queue_sql.format_table(connection.dialect, address)
        indexes = sa.text(
            "SELECT i.* FROM sys.indexes AS i WHERE i.object_id = OBJECT_ID(:table) "
            "ORDER BY i.index_id"
        ).bindparams(table=table)
        columns = sa.text(
            "SELECT c.name, TYPE_NAME(c.user_type_id), c.max_length, c.is_nullable, "
            "c.is_identity FROM sys.columns AS c WHERE c.object_id = OBJECT_ID(:table) "
            "ORDER BY c.column_id"
        ).bindparams(table=table)
        return [tuple(row) for row in connection.execute(columns)] + [
            tuple(row) for row in connection.execute(indexes)
        ]

    def count(self, connection: Connection, address: addressing.QueueAddress) -> int:
        """From the catalog: a ``COUNT(*)`` would scan (and lock) a big queue for nothing."""
        statement = sa.text(
            "SELECT COALESCE(SUM(rows), 0) FROM sys.partitions "
            "WHERE object_id = OBJECT_ID(:table) AND index_id IN (0, 1)"
        ).bindparams(table=queue_sql.format_table(connection.dialect, address))
        return int(connection.execute(statement).scalar_one())

    def guarded_create_table(
        self, dialect: Dialect, name: str, elements: Sequence[sa.schema.SchemaItem]
    ) -> str | None:
        """``IF OBJECT_ID(...) IS NULL`` around the ``CREATE TABLE``."""
        table = sa.Table(name, sa.MetaData(), *elements)
        create = steps.compile_ddl(sa.schema.CreateTable(table), dialect)
        quoted = dialect.identifier_preparer.format_table(table)
        return f"IF OBJECT_ID({_n_literal(quoted)}, N'U') IS NULL\nBEGIN\n{create}\nEND"

    def guarded_create_index(
        self,
        dialect: Dialect,
        name: str,
        table: str,
        columns: Sequence[str],
        kwargs: dict[str, Any],
    ) -> str | None:
        """``IF NOT EXISTS (SELECT 1 FROM sys.indexes ...)`` before the ``CREATE INDEX``."""
        model = sa.Table(table, sa.MetaData(), *(sa.Column(column) for column in columns))
        index = sa.Index(name, *(model.c[column] for column in columns), **kwargs)
        create = steps.compile_ddl(sa.schema.CreateIndex(index), dialect)
        quoted = dialect.identifier_preparer.format_table(model)
        # A filtered index needs these SET options in the session that creates it.
        options = "SET ANSI_NULLS, QUOTED_IDENTIFIER ON;\n" if "WHERE" in create else ""
        return (
            f"{options}IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = {_n_literal(name)} "
            f"AND object_id = OBJECT_ID({_n_literal(quoted)}))\n{create}"
        )


_IMPL = MssqlImpl()
