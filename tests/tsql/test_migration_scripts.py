"""Offline scripts (`alembic upgrade head --sql`, `sqlqueue migrate --sql`).

T-SQL: golden files (no SQL Server runs here, so the exact text is the contract; set
SQLQUEUE_UPDATE_GOLDEN=1 to rewrite them after a deliberate change), plus the checks a DBA
relies on: for each named queue, the Expires index with INCLUDE and filter, the nvarchar Headers
change and the RowVersion index, each statement naming the table. PostgreSQL: the scripts are run
for real on legacy tables and must leave them current, twice in a row.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from sqlqueue_orm import cli, exceptions
from sqlqueue_orm.migration import environment
from sqlqueue_orm.models.queue_table import build_queue_table
from tests.conftest import only
from tests.migration import shapes
from testsupport import legacy

GOLDEN = Path(__file__).with_name("golden")
MSSQL_URL = "mssql+pyodbc://user:pw@host/db?driver=FreeTDS"  # nothing connects
LAST_QUEUE_REVISION = "0004_rowversion_layout"  # later revisions belong to other features
NAMED = ["orders-v1 queue.x@[Legacy Queues]", "[o'brien]] q]@[sa]]les]"]
NAMED_SQL = {
    "[Legacy Queues].[orders-v1 queue.x]": "N'[Legacy Queues].[orders-v1 queue.x]'",
    "[sa]]les].[o'brien]] q]": "N'[sa]]les].[o''brien]] q]'",
}


def _script(url: str, revision: str, downgrade: bool = False, **kwargs: Any) -> str:
    out = io.StringIO()
    config = environment.alembic_config(url, stdout=out, **kwargs)
    if downgrade:
        command.downgrade(config, revision, sql=True)
    else:
        command.upgrade(config, revision, sql=True)
    return out.getvalue()


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SQLQUEUE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed; see {path}"


@pytest.fixture(scope="module")
def named_tsql() -> str:
    return _script(MSSQL_URL, f"base:{LAST_QUEUE_REVISION}", queues=NAMED)


@pytest.fixture(scope="module")
def looping_tsql() -> str:
    return _script(MSSQL_URL, f"base:{LAST_QUEUE_REVISION}", schemas=["Legacy Queues", "dbo"])


def test_named_tsql_golden(named_tsql: str) -> None:
    _golden("upgrade_named.mssql.sql", named_tsql)


def test_looping_tsql_golden(looping_tsql: str) -> None:
    _golden("upgrade_loop.mssql.sql", looping_tsql)


def test_downgrade_tsql_golden() -> None:
    script = _script(MSSQL_URL, f"{LAST_QUEUE_REVISION}:base", downgrade=True, queues=NAMED[:1])
    _golden("downgrade_named.mssql.sql", script)


def _batches(script: str) -> list[str]:
    return [batch.strip() for batch in script.split("\nGO\n") if batch.strip()]


def test_named_tsql_has_every_change_for_each_table(named_tsql: str) -> None:
    batches = _batches(named_tsql)
    for table, literal in NAMED_SQL.items():
        mine = [batch for batch in batches if f"OBJECT_ID({literal}, N'U')" in batch]
        assert len(mine) == 4, table  # one named block per table per step
        text = "\n".join(mine)
        assert (
            f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {table} ([Expires]) "
            "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL WITH (ONLINE = ON);"
        ) in text
        assert f"ALTER TABLE {table} ALTER COLUMN [Headers] NVARCHAR(max) NOT NULL;" in text
        assert (
            f"CREATE CLUSTERED INDEX [Index_RowVersion] ON {table} ([RowVersion]) "
            "WITH (DROP_EXISTING = ON, ONLINE = ON);"
        ) in text
        # Every DDL statement names the table.
        for line in text.splitlines():
            if re.match(r"\s*(CREATE .*INDEX|DROP INDEX|ALTER TABLE|ALTER INDEX)", line):
                assert table in line, line
            if "sp_executesql N'ALTER INDEX" in line:
                assert table.replace("'", "''") in line, line
    # Filtered indexes need QUOTED_IDENTIFIER ON (sqlcmd starts with it OFF): every batch sets it.
    for batch in batches:
        if "INDEX" in batch and "queue" in batch:
            assert "QUOTED_IDENTIFIER" in batch


def test_looping_tsql_finds_tables_by_signature(looping_tsql: str) -> None:
    batches = [b for b in _batches(looping_tsql) if "CURSOR" in b]
    assert len(batches) == 4
    for batch in batches:
        assert "FROM sys.tables AS t JOIN sys.schemas AS s" in batch
        assert "s.name IN (N'Legacy Queues', N'dbo')" in batch
        assert "(N'Id', N'Expires', N'Headers', N'Body', N'RowVersion')) = 5" in batch
        assert "QUOTENAME(s.name) + N'.' + QUOTENAME(t.name)" in batch
        assert "EXEC sp_executesql @sql;" in batch
    assert (
        "SET @sql = N'CREATE NONCLUSTERED INDEX [Index_Expires] ON ' + @table + N' ([Expires])"
        in looping_tsql
    )


def test_an_explicit_range_never_connects() -> None:
    # An unreachable server: a script with its range given is written without it.
    script = _script("postgresql+psycopg://nobody@127.0.0.1:1/none", f"base:{LAST_QUEUE_REVISION}")
    assert "DO $sqlqueue$" in script


def test_sqlqueue_migrate_sql_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        [
            "--url",
            MSSQL_URL,
            "migrate",
            "--sql",
            "--revision",
            f"base:{LAST_QUEUE_REVISION}",
            "--queues",
            ",".join(NAMED),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("-- queue ") == 8
    assert "ALTER TABLE [Legacy Queues].[orders-v1 queue.x] ALTER COLUMN [Headers]" in out


def test_offline_sqlite_is_refused() -> None:
    with pytest.raises(exceptions.ConfigurationError, match="SQL Server and PostgreSQL"):
        _script("sqlite:///x.db", "head")


# -- PostgreSQL: run the scripts ----------------------------------------------------------------
SCHEMA = "Legacy Queues"
PG_TABLES = {
    "v1": "v1 orders-q.x",
    "2.2.2": "2.2.2 billing-q.x",
    "3.1": "3.1-Ünïcödé-audit log." + "ø" * 15,
    "heap": "heap shipping-q.x",
    "renamed": "renamed q.x",
    "no-indexes": "no-indexes q.x",
    "no-recoverable": "no-recoverable q.x",
}


def _run_script(engine: sa.engine.Engine, script: str) -> None:
    """Run a psql-style script: statements end with ';' and a blank line (as Alembic writes)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for statement in script.split(";\n\n"):
            if statement.strip():
                connection.exec_driver_sql(statement, execution_options={"no_parameters": True})


@only("postgresql")
@pytest.mark.parametrize("form", ["named", "looping"])
def test_postgresql_script_upgrades_every_era(database: Any, form: str) -> None:
    snapshots = {}
    with database.engine.begin() as connection:
        for name in (SCHEMA, "fresh"):
            connection.execute(sa.schema.CreateSchema(name))
        for number, (era, table) in enumerate(PG_TABLES.items()):
            legacy.create(connection, era, table, SCHEMA)
            recoverable = era != "no-recoverable"
            legacy.insert(
                connection, table, SCHEMA, legacy.messages(200, number, has_recoverable=recoverable)
            )
            snapshots[era] = legacy.snapshot(connection, table, SCHEMA, recoverable)
            build_queue_table(sa.MetaData(), table, "fresh", connection.dialect).create(connection)
    if form == "named":
        queues = [f"[{table}]@[{SCHEMA}]" for table in PG_TABLES.values()]
        script = _script(database.url, "head", queues=queues)
    else:
        script = _script(database.url, "head", schemas=[SCHEMA])
    assert "CONCURRENTLY" in script if form == "named" else "FOR tbl IN" in script

    _run_script(database.engine, script)
    if form == "named":
        # A named script's CREATE INDEX CONCURRENTLY of steps 0001-0004 names the SQL Server
        # layout's columns, which tables in NServiceBus's PostgreSQL layout no longer have: run
        # again, a named script starts from the database's revision (the loop skips such tables).
        script = _script(database.url, "0006_spark_send_ledger:head", queues=queues)
    else:
        with database.engine.begin() as connection:  # offline scripts start from base
            connection.exec_driver_sql("DROP TABLE sqlqueue_alembic_version")
    _run_script(database.engine, script)  # idempotent, shared tables too: nothing changes

    with database.engine.connect() as connection:
        for era, table in PG_TABLES.items():
            recoverable = era != "no-recoverable"
            fresh = shapes.with_kept_correlation_id(shapes.describe(connection, table, "fresh"))
            assert shapes.describe(connection, table, SCHEMA) == fresh, era
            assert legacy.snapshot(connection, table, SCHEMA, recoverable) == snapshots[era], era
