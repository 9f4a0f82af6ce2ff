"""T-SQL of the Spark pipeline."""

from __future__ import annotations

import pytest

from sqlqueue_orm.models.queue_table import queue_table

pytest.importorskip("pyspark")

from sqlqueue_orm import dialects
from sqlqueue_orm.contrib.spark import fences, locking, streaming


def test_sql_server_statements():
    from sqlalchemy.dialects import mssql

    dialect = mssql.dialect()
    table = queue_table("audit", "nsb")
    fence = str(fences.range_scan_statement(
        table, 41, dialects.mssql.STREAM_FENCE.scan_hint or ""
    ).compile(dialect=dialect))
    assert " ".join(fence.split()) == (
        "SELECT count_big(*) AS count_big_1, max([nsb].[audit].[RowVersion]) AS max_1 "
        "FROM [nsb].[audit] WITH (READCOMMITTEDLOCK) "
        "WHERE [nsb].[audit].[RowVersion] > :RowVersion_1"
    )
    delete = str(streaming.delete_through_statement(table).compile(dialect=dialect))
    assert " ".join(delete.split()) == (
        "DELETE FROM [nsb].[audit] WHERE [nsb].[audit].[RowVersion] <= :end"
    )
    lock = locking.lock_statement("mssql").text
    assert "@LockOwner = 'Session', @LockTimeout = 0" in lock
    assert lock.startswith("DECLARE @status int; EXEC @status = sp_getapplock @Resource = ")
    from sqlalchemy.schema import CreateTable

    from sqlqueue_orm.contrib.spark.models import SparkSendLedger

    ddl = " ".join(str(CreateTable(SparkSendLedger.__table__).compile(dialect=dialect)).split())
    assert ddl == (
        "CREATE TABLE [SparkSendLedger] ( [Destination] NVARCHAR(200) NOT NULL, "
        "[MessageId] NVARCHAR(200) NOT NULL, [SentAt] DATETIME NOT NULL, "
        "CONSTRAINT [pk_SparkSendLedger] PRIMARY KEY ([Destination], [MessageId]) )"
    )
