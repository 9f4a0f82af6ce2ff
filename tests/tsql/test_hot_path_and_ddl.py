"""Golden tests: every T-SQL statement we emit, compiled by SQLAlchemy's mssql dialect (pyodbc).

No SQL Server runs here, so the exact text is the contract; live tests run when one is configured.
"""

import subprocess
import sys

import pytest
import sqlalchemy as sa

from sqlqueue_orm import dialects
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.cli import ddl_dialect
from sqlqueue_orm.config import QueueSettings
from sqlqueue_orm.exceptions import ConfigurationError
from sqlqueue_orm.migration import tsql
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.schema import QueueInstaller

MSSQL_URL = "mssql+pyodbc://user:pw@host/db?driver=FreeTDS"  # nothing connects


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
    # One error-queue row by Id (retry, delete), locked and skipped as the receive does.
    "receive_by_id": (
        f"WITH message AS (SELECT TOP(1) * FROM {TABLE} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE [Id] = ?) DELETE FROM message OUTPUT deleted.[Id], deleted.[RowVersion], "
        "CASE WHEN deleted.[Expires] IS NULL THEN 0 WHEN deleted.[Expires] > GETUTCDATE() THEN 0 "
        "ELSE 1 END, CAST(CAST(deleted.[Headers] AS nvarchar(max)) AS varbinary(max)), "
        "deleted.[Body];",
        ("id",),
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_hot_path_statement(dialect, name):
    template = getattr(dialects.mssql.HOT_PATH, name)
    statement = sql.render(template, dialect, sql.format_table(dialect, HOSTILE))
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


# -- the NServiceBus 8+ heap layout -----------------------------------------------------------
def test_queue_ddl_heap_layout_is_nservicebus_8s():
    # CreateQueueText, src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs
    # (Particular/NServiceBus.SqlServer 214c4e8f): a heap, then
    # "CREATE NONCLUSTERED INDEX Index_RowVersion ON {0} ([RowVersion] ASC)" and Index_Expires.
    installer = QueueInstaller(QueueSettings(sql_server_layout="heap"))
    for version in (None, 2017):
        statements = installer.ddl(QueueAddress("orders", "sales"), ddl_dialect("mssql", version))
        assert statements == [
            CREATE_TABLE,
            "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion])",
            EXPIRES_INDEX,
        ]
    # The layout is SQL Server's alone: the PostgreSQL DDL is the same either way.
    postgresql = ddl_dialect("postgresql")
    assert installer.ddl(QueueAddress("orders"), postgresql) == QueueInstaller().ddl(
        QueueAddress("orders"), postgresql
    )


@pytest.mark.parametrize("bad", ["HEAP", "nonclustered", "", None])
def test_unknown_sql_server_layout_is_refused_by_name(bad):
    with pytest.raises(ConfigurationError, match=repr(bad).replace("(", r"\(")):
        QueueSettings(sql_server_layout=bad)


def test_cli_ddl_heap_layout():
    out = subprocess.run(
        [
            *(sys.executable, "-m", "sqlqueue_orm.cli", "ddl", "--dialect", "mssql"),
            *("--sql-server-layout", "heap", "orders@[sales]"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        "\nCREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion])\n"
        in (out)
    )
    assert "CLUSTERED INDEX [Index_RowVersion]" not in out.replace("NONCLUSTERED", "")


# -- the installer's applock --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("catalog", "schema_name", "table", "resource"),
    [
        # '{0}_lock' with {0} = CanonicalQueueAddress.QualifiedTableName (SqlServerConstants.cs,
        # CanonicalQueueAddress.cs, SqlServerNameHelper.Quote; NServiceBus.SqlServer 214c4e8f).
        ("nservicebus", "dbo", "Samples.Sales", "[nservicebus].[dbo].[Samples.Sales]_lock"),
        ("my]db", "sa]les", "q]", "[my]]db].[sa]]les].[q]]]_lock"),
    ],
)
def test_install_lock_resource_is_nservicebus_installers(catalog, schema_name, table, resource):
    assert dialects.mssql.lock_resource(catalog, schema_name, table) == resource


def test_install_lock_statement():
    assert dialects.mssql.SUPPORT.install_lock == (
        "DECLARE @status int, @resource nvarchar(255) = CAST(:resource AS varchar(8000)); "
        "EXEC @status = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Transaction', @LockTimeout = 60000; SELECT @status"
    )
    assert dialects.mssql.CATALOG_AND_SCHEMA == "SELECT DB_NAME(), SCHEMA_NAME()"


# -- the migration's heap path (0004) ------------------------------------------------------------
ADDRESS = QueueAddress("orders", "sales")
NEW_CLUSTERED = "CREATE CLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion])"
KEPT = "a heap (the NServiceBus 8+ layout); kept, Index_RowVersion nonclustered"


def _lines(batch: str) -> list[str]:
    return [line.strip() for line in batch.splitlines()]


def test_migration_keeps_a_heap_unless_asked():
    lines = _lines(tsql.table_batch("0004_rowversion_layout", "upgrade", ADDRESS))
    # The only clustered builds left rebuild an Index_RowVersion that already is clustered
    # (on the wrong key): never a heap.
    clustered = [line for line in lines if line.startswith("CREATE CLUSTERED INDEX")]
    assert clustered == [
        f"{NEW_CLUSTERED} WITH (DROP_EXISTING = ON, ONLINE = ON);",
        f"{NEW_CLUSTERED} WITH (DROP_EXISTING = ON);",
    ]
    guard = lines[lines.index(clustered[0]) - 4]
    assert "i.type = 1 AND NOT" in guard
    # A heap with no Index_RowVersion gets a nonclustered one; one with it is left as it is
    # (rebuilt nonclustered only if its key is wrong); the batch says so each time.
    assert sum(KEPT in line for line in lines) == 2
    assert (
        "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion]) "
        "WITH (ONLINE = ON);"
    ) in lines
    assert (
        "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sales].[orders] ([RowVersion]) "
        "WITH (DROP_EXISTING = ON, ONLINE = ON);"
    ) in lines


def test_migration_rebuilds_heaps_clustered_when_asked():
    lines = _lines(
        tsql.table_batch("0004_rowversion_layout", "upgrade", ADDRESS, cluster_heaps=True)
    )
    assert not any(KEPT in line for line in lines)
    assert f"{NEW_CLUSTERED} WITH (ONLINE = ON);" in lines  # a heap with no Index_RowVersion
    heap_rebuild = f"{NEW_CLUSTERED} WITH (DROP_EXISTING = ON, ONLINE = ON);"
    assert lines.count(heap_rebuild) == 2  # the nonclustered one, and a clustered wrong key
    assert (
        "-- Index_RowVersion must be the clustered index on (RowVersion): asked to rebuild heaps"
        in (lines)
    )


def test_sqlqueue_migrate_cluster_heaps_flag_reaches_the_script():
    def script(*flags: str) -> str:
        return subprocess.run(
            [
                *(sys.executable, "-m", "sqlqueue_orm.cli", "--url", MSSQL_URL, "migrate"),
                # An explicit FROM:TO range: no SQL Server to read the current revision from.
                *("--sql", "--queues", "orders@[sales]"),
                *("--revision", "0003_filter_expires_index:0004_rowversion_layout"),
                *flags,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    assert KEPT in script()
    kept_out = script("--cluster-heaps")
    assert KEPT not in kept_out
    assert f"{NEW_CLUSTERED} WITH (ONLINE = ON);" in kept_out


@pytest.mark.parametrize(("value", "rebuilds"), [("true", True), ("false", False)])
def test_alembic_x_cluster_heaps_reaches_the_script(value, rebuilds):
    import argparse
    import io

    from alembic import command

    from sqlqueue_orm.migration import environment

    out = io.StringIO()
    config = environment.alembic_config(MSSQL_URL, queues=["orders@[sales]"], stdout=out)
    config.cmd_opts = argparse.Namespace(x=[f"cluster_heaps={value}"])
    # An explicit FROM:TO range: there is no SQL Server here to read the revision from.
    command.upgrade(config, "0003_filter_expires_index:0004_rowversion_layout", sql=True)
    assert (KEPT not in out.getvalue()) is rebuilds
    assert (f"{NEW_CLUSTERED} WITH (ONLINE = ON);" in out.getvalue()) is rebuilds
