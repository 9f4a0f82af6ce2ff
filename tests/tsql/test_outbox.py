"""T-SQL of the outbox: revision 0005, the claim (READPAST), mark and defer, batched cleanup."""

from __future__ import annotations

from sqlalchemy.dialects import mssql, postgresql

from sqlqueue_orm.sending import outbox_statements
from tests.tsql.offline import revision_statements


def test_the_revision_tsql():
    statements = revision_statements("0005_outbox_data")
    assert statements == [
        "IF OBJECT_ID(N'[OutboxData]', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE [OutboxData] (\n"
        "    [MessageId] NVARCHAR(200) NOT NULL, \n"
        "    [Dispatched] BIT NOT NULL DEFAULT 0, \n"
        "    [DispatchedAt] DATETIME NULL, \n"
        "    [PersistenceVersion] VARCHAR(23) NOT NULL, \n"
        "    [Operations] NVARCHAR(max) NOT NULL, \n"
        "    CONSTRAINT [pk_OutboxData] PRIMARY KEY NONCLUSTERED ([MessageId])\n"
        ")\nEND;",
        "SET ANSI_NULLS, QUOTED_IDENTIFIER ON;\n"
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'Index_DispatchedAt' "
        "AND object_id = OBJECT_ID(N'[OutboxData]'))\n"
        "CREATE NONCLUSTERED INDEX [Index_DispatchedAt] ON [OutboxData] ([DispatchedAt]) "
        "WHERE [Dispatched] = 1;",
        "SET ANSI_NULLS, QUOTED_IDENTIFIER ON;\n"
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'Index_Pending' "
        "AND object_id = OBJECT_ID(N'[OutboxData]'))\n"
        "CREATE NONCLUSTERED INDEX [Index_Pending] ON [OutboxData] ([DispatchedAt]) "
        "WHERE [Dispatched] = 0;",
        "DROP TABLE [OutboxData];",
    ]


def test_claim_tsql_skips_rows_other_dispatchers_hold():
    assert _tsql(outbox_statements.claim_statement(limit=100)) == (
        # SQLAlchemy renders the TOP value as a literal when the statement runs.
        "SELECT TOP __[POSTCOMPILE_param_1] [OutboxData].[MessageId], [OutboxData].[Operations] \n"
        "FROM [OutboxData] WITH (UPDLOCK, READPAST, ROWLOCK) \n"
        "WHERE [OutboxData].[Dispatched] = 0 AND [OutboxData].[DispatchedAt] < :cutoff "
        "ORDER BY [OutboxData].[DispatchedAt]"
    )
    # A dispatcher skipping the records it could not route (a list bound when it runs).
    assert _tsql(outbox_statements.claim_statement(limit=100, skipping=True)) == (
        "SELECT TOP __[POSTCOMPILE_param_1] [OutboxData].[MessageId], [OutboxData].[Operations] \n"
        "FROM [OutboxData] WITH (UPDLOCK, READPAST, ROWLOCK) \n"
        "WHERE [OutboxData].[Dispatched] = 0 AND [OutboxData].[DispatchedAt] < :cutoff "
        "AND ([OutboxData].[MessageId] NOT IN (__[POSTCOMPILE_skipped])) "
        "ORDER BY [OutboxData].[DispatchedAt]"
    )
    assert _tsql(outbox_statements.claim_statement(by_id=True)) == (
        "SELECT [OutboxData].[MessageId], [OutboxData].[Operations] \n"
        "FROM [OutboxData] WITH (UPDLOCK, READPAST, ROWLOCK) \n"
        "WHERE [OutboxData].[Dispatched] = 0 AND [OutboxData].[MessageId] = :message_id"
    )


def test_mark_and_defer_tsql():
    assert _tsql(outbox_statements.mark_dispatched_statement()) == (
        "UPDATE [OutboxData] SET [Dispatched]=1, [DispatchedAt]=:now, [Operations]=:Operations "
        "WHERE [OutboxData].[MessageId] = :message_id"
    )
    assert _tsql(outbox_statements.defer_statement()) == (
        "UPDATE [OutboxData] SET [DispatchedAt]=:until "
        "WHERE [OutboxData].[MessageId] = :message_id AND [OutboxData].[Dispatched] = 0"
    )


def test_cleanup_tsql_is_nservicebus_batched_delete():
    assert _tsql(outbox_statements.cleanup_statement(mssql.dialect())) == (
        "DELETE TOP (:batch_size) FROM [OutboxData] WITH (ROWLOCK, READPAST) "
        "WHERE [Dispatched] = 1 AND [DispatchedAt] < :cutoff OPTION (MAXDOP 1)"
    )
    text = str(
        outbox_statements.cleanup_statement(postgresql.dialect()).compile(dialect=postgresql.dialect())
    )
    assert "FOR UPDATE SKIP LOCKED" in text and text.startswith('DELETE FROM "OutboxData"')


def _tsql(statement):
    return str(statement.compile(dialect=mssql.dialect()))
