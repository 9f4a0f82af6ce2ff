"""Golden tests: every T-SQL statement we emit, compiled by SQLAlchemy's mssql dialect (pyodbc).

No SQL Server runs here, so the exact text is the contract; live tests run when one is configured.
"""

import subprocess
import sys

import pytest
import sqlalchemy as sa

from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.cli import ddl_dialect
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.schema import QueueInstaller


@pytest.fixture(scope="module")
def dialect():
    # The dialect a real mssql+pyodbc engine uses (qmark parameters); nothing connects.
    return sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect


HOSTILE = QueueAddress("my]q'; --", "sa]les")
TABLE = "[sa]]les].[my]]q'; --]"
EXPIRES = (
    "CASE WHEN CAST(? AS bigint) IS NULL THEN NULL ELSE DATEADD(ms, CAST(? AS bigint) % 86400000, "
    "DATEADD(day, CAST(? AS bigint) / 86400000, GETUTCDATE())) END"
)

GOLDEN = {
    "send": (
        f"INSERT INTO {TABLE} ([Id], [Recoverable], [Expires], [Headers], [Body]) "
        f"VALUES (?, 1, {EXPIRES}, ?, ?)",
        ("id", "ttbr", "ttbr", "ttbr", "headers", "body"),
    ),
    "send_without_recoverable": (
        f"INSERT INTO {TABLE} ([Id], [Expires], [Headers], [Body]) VALUES (?, {EXPIRES}, ?, ?)",
        ("id", "ttbr", "ttbr", "ttbr", "headers", "body"),
    ),
    "receive": (
        f"WITH message AS (SELECT TOP(?) * FROM {TABLE} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "ORDER BY [RowVersion]) DELETE FROM message OUTPUT deleted.[Id], deleted.[RowVersion], "
        "CASE WHEN deleted.[Expires] IS NULL THEN 0 WHEN deleted.[Expires] > GETUTCDATE() THEN 0 "
        "ELSE 1 END, CAST(CAST(deleted.[Headers] AS nvarchar(max)) AS varbinary(max)), "
        "deleted.[Body];",
        ("n",),
    ),
    "peek": (
        "SELECT ISNULL(CAST(MAX([RowVersion]) - MIN([RowVersion]) + 1 AS bigint), 0) "
        f"FROM {TABLE} WITH (READPAST, READCOMMITTEDLOCK);",
        (),
    ),
    "purge_expired": (
        f"WITH message AS (SELECT TOP(?) * FROM {TABLE} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE [Expires] < GETUTCDATE() ORDER BY [RowVersion]) DELETE FROM message;",
        ("n",),
    ),
    "purge_all": (f"DELETE FROM {TABLE};", ()),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_hot_path_statement(dialect, name):
    statement = sql.render(getattr(sql.MSSQL, name), dialect, sql.format_table(dialect, HOSTILE))
    text, names = GOLDEN[name]
    assert statement.text == text
    assert statement.names == names
    assert statement.positional


def test_catalog_names(dialect):
    assert sql.format_table(dialect, QueueAddress("q", "dbo", "other.db")) == "[other.db].[dbo].[q]"
    assert sql.format_table(dialect, QueueAddress("q", None, "my]db")) == "[my]]db]..[q]"


CREATE_TABLE = (
    "CREATE TABLE [sales].[orders] (\n"
    "\t[Id] UNIQUEIDENTIFIER NOT NULL, \n"
    "\t[CorrelationId] VARCHAR(255) NULL, \n"
    "\t[ReplyToAddress] VARCHAR(255) NULL, \n"
    "\t[Recoverable] BIT NOT NULL, \n"
    "\t[Expires] DATETIME NULL, \n"
    "\t[Headers] NVARCHAR(max) NOT NULL, \n"
    "\t[Body] VARBINARY(max) NULL, \n"
    "\t[RowVersion] BIGINT NOT NULL IDENTITY(1,1)\n"
    ")"
)
EXPIRES_INDEX = (
    "CREATE NONCLUSTERED INDEX [Index_Expires] ON [sales].[orders] ([Expires]) "
    "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL"
)


def test_queue_ddl_sql_server_2019_and_later():
    statements = QueueInstaller().ddl(
        QueueAddress("orders", "sales"), ddl_dialect("mssql"), body_string=True
    )
    assert statements == [
        CREATE_TABLE,
        "CREATE CLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion]) "
        "WITH (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)",
        EXPIRES_INDEX,
        "ALTER TABLE [sales].[orders] ADD [BodyString] AS CAST([Body] AS NVARCHAR(max))",
    ]


def test_queue_ddl_before_sql_server_2019_has_no_sequential_key_option():
    statements = QueueInstaller().ddl(QueueAddress("orders", "sales"), ddl_dialect("mssql", 2017))
    assert statements == [
        CREATE_TABLE,
        "CREATE CLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion])",
        EXPIRES_INDEX,
    ]


def test_install_lock_statement():
    from sqlqueue_orm import schema

    assert "sp_getapplock @Resource = :resource, @LockMode = 'Exclusive', @LockOwner = " in (
        schema._MSSQL_INSTALL_LOCK
    )


def test_cli_ddl_names_the_queue_in_every_statement():
    out = subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", "ddl", "--dialect", "mssql", "o'rders@[sa les]"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    statements = [part.strip() for part in out.split("\nGO\n") if part.strip()]
    assert statements[0].startswith("-- queue o'rders@[sa les]\nCREATE TABLE [sa les].[o'rders] (")
    assert "[RowVersion] BIGINT NOT NULL IDENTITY(1,1)" in statements[0]
    assert statements[1] == (
        "CREATE CLUSTERED INDEX [Index_RowVersion] ON [sa les].[o'rders] ([RowVersion]) "
        "WITH (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON)"
    )
    assert statements[2] == (
        "CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa les].[o'rders] ([Expires]) "
        "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL"
    )
    assert all("[sa les].[o'rders]" in statement for statement in statements)
