"""Golden T-SQL of native delayed delivery: the table, its statements and revision 0009's script.

No SQL Server runs here, so the exact text is the contract (SQLQUEUE_UPDATE_GOLDEN=1 rewrites the
script's golden file after a deliberate change). The vectors come from NServiceBus's
``SqlServerConstants.cs`` (CreateDelayedMessageStoreText, StoreDelayedMessageText,
MoveDueDelayedMessageText), Particular/NServiceBus.SqlServer.
"""

from __future__ import annotations

import sqlalchemy as sa

from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.models.delayed_table import delayed_table
from sqlqueue_orm.queuing.delayed_table import DelayedTable
from tests.tsql.test_migration_scripts import MSSQL_URL, _golden, _script

DIALECT = sa.create_engine(MSSQL_URL).dialect
DELAYED = QueueAddress("sales.Delayed", "sa]les")
QUEUE = QueueAddress("sales", "sa]les")


def test_the_delayed_table_is_nservicebus_s():
    table = delayed_table(DELAYED.table, DELAYED.schema, DIALECT)
    create = str(sa.schema.CreateTable(table).compile(dialect=DIALECT))
    assert " ".join(create.split()) == (
        "CREATE TABLE [sa]]les].[sales.Delayed] ( [Headers] NVARCHAR(max) NOT NULL, "
        "[Body] VARBINARY(max) NULL, [Due] DATETIME NOT NULL, "
        "[RowVersion] BIGINT NOT NULL IDENTITY(1,1) )"
    )  # a heap: no primary key, as NServiceBus
    indexes = [
        str(sa.schema.CreateIndex(index).compile(dialect=DIALECT))
        for index in table.indexes
        if index._ddl_if is not None and index._ddl_if.dialect == "mssql"
    ]
    assert indexes == ["CREATE NONCLUSTERED INDEX [Index_Due] ON [sa]]les].[sales.Delayed] ([Due])"]


def test_store_move_and_next_due_statements():
    table = DelayedTable(DELAYED, QUEUE, DIALECT)
    assert table._store.text == (
        "INSERT INTO [sa]]les].[sales.Delayed] ([Headers], [Body], [Due]) VALUES (?, ?, "
        "DATEADD(ms, CAST(? AS bigint) % 86400000, "
        "DATEADD(day, CAST(? AS bigint) / 86400000, GETUTCDATE())))"
    )
    assert table._store.names == ("headers", "body", "due_ms", "due_ms")
    [move] = table._move
    assert move.text == (
        "WITH message AS (SELECT TOP(?) * FROM [sa]]les].[sales.Delayed] "
        "WITH (UPDLOCK, READPAST, ROWLOCK) WHERE [Due] < GETUTCDATE() ORDER BY [Due]) "
        "DELETE FROM message "
        "OUTPUT NEWID(), NULL, NULL, 1, NULL, deleted.[Headers], deleted.[Body] "
        "INTO [sa]]les].[sales] ([Id], [CorrelationId], [ReplyToAddress], [Recoverable], "
        "[Expires], [Headers], [Body]);"
    )
    assert table._next_due.text == (
        "SELECT TOP 1 DATEDIFF_BIG(ms, GETUTCDATE(), [Due]) / 1000.0 "
        "FROM [sa]]les].[sales.Delayed] WITH (READPAST) ORDER BY [Due]"
    )


def test_revision_0009_offline_script():
    script = _script(
        MSSQL_URL, "0008_postgresql_nsb_layout:0009_delayed_delivery", schemas=["o'brien]"]
    )
    _golden("0009_delayed_delivery.mssql.sql", script)
    assert "s.name IN (N'o''brien]')" in script
    assert "QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)" in script


def test_revision_0009_offline_script_for_the_default_schema():
    script = _script(MSSQL_URL, "0008_postgresql_nsb_layout:0009_delayed_delivery")
    assert "(s.name = SCHEMA_NAME())" in script
    assert "CREATE NONCLUSTERED INDEX [Index_Due] ON ' + @table + N' ([Due])" in script
