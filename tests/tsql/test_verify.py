"""T-SQL of ``sqlqueue verify``: its catalog query and its repairs, compiled for SQL Server.

No SQL Server runs here: the compiled text is the contract, with a hostile queue name, so every
name is seen quoted by SQLAlchemy's mssql dialect (``]`` doubled).
"""

from __future__ import annotations

import sqlalchemy as sa

from sqlqueue_orm import dialects, verify
from sqlqueue_orm.models.queue_table import build_queue_table

TABLE = "[sa]]les].[my]]q'; --]"


def _dialect() -> sa.Dialect:
    # The dialect a real mssql+pyodbc engine uses (qmark parameters); nothing connects.
    return sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect


def _table() -> sa.Table:
    return build_queue_table(sa.MetaData(), "my]q'; --", "sa]les", "mssql")


def test_index_catalog_query_binds_the_quoted_table() -> None:
    compiled = sa.text(dialects.mssql.INDEX_CATALOG).compile(dialect=_dialect())
    assert str(compiled) == (
        "SELECT i.name, i.filter_definition, CASE WHEN i.type = 1 THEN 1 ELSE 0 END, c.name "
        "FROM sys.indexes AS i LEFT JOIN sys.index_columns AS ic ON ic.object_id = i.object_id "
        "AND ic.index_id = i.index_id AND ic.is_included_column = 1 LEFT JOIN sys.columns AS c "
        "ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
        "WHERE i.object_id = OBJECT_ID(?)"
    )
    assert compiled.positiontup == ["table"]
    # The value bound: the name as SQLAlchemy quotes it, never spliced into the SQL.
    assert _dialect().identifier_preparer.format_table(_table()) == TABLE


def test_column_repairs() -> None:
    table, dialect = _table(), _dialect()
    assert verify.add_column_statement(table, table.c.CorrelationId, dialect) == (
        f"ALTER TABLE {TABLE} ADD [CorrelationId] VARCHAR(255) NULL"
    )
    # A type repair restates NOT NULL: ALTER COLUMN with the type alone would allow NULL.
    for what in ("type", "nullability"):
        assert verify.alter_column_statements(table, table.c.Headers, dialect, what) == (
            f"ALTER TABLE {TABLE} ALTER COLUMN [Headers] NVARCHAR(max) NOT NULL",
        )


def test_index_repairs_keep_include_filter_and_clustering() -> None:
    dialect = _dialect()
    indexes = {str(index.name): index for index in _table().indexes}
    assert verify.ddl.compile_ddl(sa.schema.CreateIndex(indexes["Index_Expires"]), dialect) == (
        f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {TABLE} ([Expires]) "
        "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL"
    )
    assert verify.ddl.compile_ddl(
        sa.schema.CreateIndex(indexes["Index_RowVersion"]), dialect
    ) == (
        f"CREATE CLUSTERED INDEX [Index_RowVersion] ON {TABLE} ([RowVersion]) "
        "WITH (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)"
    )
    heap = build_queue_table(sa.MetaData(), "my]q'; --", "sa]les", "mssql", "heap")
    heap_index = next(index for index in heap.indexes if index.name == "Index_RowVersion")
    assert verify.ddl.compile_ddl(sa.schema.CreateIndex(heap_index), dialect) == (
        f"CREATE NONCLUSTERED INDEX [Index_RowVersion] ON {TABLE} ([RowVersion])"
    )
