"""Golden tests: the T-SQL of live endpoint control (the two upserts, revision 0015).

No SQL Server runs here, so the text compiled by the mssql+pyodbc dialect is the contract. The
upsert is an UPDATE under UPDLOCK and SERIALIZABLE, then an INSERT when it changed no row, in
the caller's transaction: the key-range lock the UPDATE takes on a missing row makes a second
upsert of the same endpoint wait, so two operators never both insert.
"""


import sqlalchemy as sa

from sqlqueue_orm import control, dialects
from tests.tsql.offline import revision_statements

#: SQL Server's control statements, as its dialect module holds them.
STATEMENTS = dialects.for_dialect("mssql").control


def _compiled(statement: str) -> sa.sql.compiler.SQLCompiler:
    dialect = sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect
    table = dialect.identifier_preparer.format_table(control.CONTROL_TABLE)
    return sa.text(statement.format(table=table)).compile(dialect=dialect)  # type: ignore[return-value]


def test_the_pause_upsert():
    compiled = _compiled(STATEMENTS.set_paused)
    assert str(compiled) == (
        "SET NOCOUNT ON; "
        "UPDATE sqlqueue_endpoint_control WITH (UPDLOCK, SERIALIZABLE) SET paused = ?, "
        "changed_at = ?, changed_by = ? WHERE endpoint = ?; "
        "IF @@ROWCOUNT = 0 "
        "INSERT INTO sqlqueue_endpoint_control (endpoint, paused, concurrency, changed_at, "
        "changed_by) VALUES (?, ?, NULL, ?, ?);"
    )
    assert compiled.positiontup == [
        "paused",
        "changed_at",
        "changed_by",
        "endpoint",
        "endpoint",
        "paused",
        "changed_at",
        "changed_by",
    ]


def test_the_concurrency_upsert():
    compiled = _compiled(STATEMENTS.set_concurrency)
    assert str(compiled) == (
        "SET NOCOUNT ON; "
        "UPDATE sqlqueue_endpoint_control WITH (UPDLOCK, SERIALIZABLE) SET concurrency = ?, "
        "changed_at = ?, changed_by = ? WHERE endpoint = ?; "
        "IF @@ROWCOUNT = 0 "
        "INSERT INTO sqlqueue_endpoint_control (endpoint, paused, concurrency, changed_at, "
        "changed_by) VALUES (?, ?, ?, ?, ?);"
    )
    assert compiled.positiontup == [
        "concurrency",
        "changed_at",
        "changed_by",
        "endpoint",
        "endpoint",
        "paused",
        "concurrency",
        "changed_at",
        "changed_by",
    ]


def test_the_other_databases_upsert_with_on_conflict():
    for name in ("postgresql", "sqlite"):
        statements = dialects.for_dialect(name).control
        assert "ON CONFLICT (endpoint) DO UPDATE SET paused = excluded.paused" in (
            statements.set_paused
        )
        assert "concurrency = excluded.concurrency" in statements.set_concurrency
        assert "paused = excluded" not in statements.set_concurrency  # a resize keeps a pause


def test_revision_0015_offline_tsql():
    statements = revision_statements("0015_endpoint_control")
    assert statements == [
        "IF OBJECT_ID(N'sqlqueue_endpoint_control', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE sqlqueue_endpoint_control (\n"
        "    endpoint NVARCHAR(450) NOT NULL, \n"  # 900 bytes: SQL Server's key limit
        "    paused BIT NOT NULL, \n"
        "    concurrency INTEGER NULL, \n"
        "    changed_at DATETIME NOT NULL, \n"
        "    changed_by NVARCHAR(400) NOT NULL, \n"
        "    CONSTRAINT pk_sqlqueue_endpoint_control PRIMARY KEY (endpoint)\n"
        ")\nEND;",
        "IF OBJECT_ID(N'sqlqueue_control_log', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE sqlqueue_control_log (\n"
        "    id BIGINT NOT NULL IDENTITY, \n"
        "    endpoint NVARCHAR(450) NOT NULL, \n"
        "    action NVARCHAR(100) NOT NULL, \n"
        "    at DATETIME NOT NULL, \n"
        "    host NVARCHAR(255) NOT NULL, \n"
        "    os_user NVARCHAR(255) NOT NULL, \n"
        "    client NVARCHAR(255) NULL, \n"
        "    CONSTRAINT pk_sqlqueue_control_log PRIMARY KEY (id)\n"
        ")\nEND;",
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = "
        "N'ix_sqlqueue_control_log_endpoint' AND object_id = OBJECT_ID(N'sqlqueue_control_log'))"
        "\nCREATE INDEX ix_sqlqueue_control_log_endpoint ON sqlqueue_control_log (endpoint);",
        "DROP TABLE sqlqueue_control_log;",
        "DROP TABLE sqlqueue_endpoint_control;",
    ]


def test_the_poll_alone_is_one_primary_key_read():
    dialect = sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect
    statement = control.read_statement(dialect)
    assert statement.text == (
        "SELECT paused, concurrency, changed_by FROM sqlqueue_endpoint_control WHERE endpoint = ?"
    )
    assert statement.names == ("endpoint",)
