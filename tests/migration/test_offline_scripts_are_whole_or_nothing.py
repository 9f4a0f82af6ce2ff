"""Offline scripts (`--sql`) are complete and fit the database, or nothing is printed at all.

Issue 10, defect 6: `migrate --sql` on SQLite printed part of a script before refusing (so
`> upgrade.sql` left a truncated file), and on PostgreSQL the script always started from base,
failing on a database already migrated (`relation "sqlqueue_alembic_version" already exists`).
Now the script is built in memory and printed once complete; it starts from the revision the
database records (or from an explicit FROM:TO range); SQLite, and an unreachable database with
no range given, are refused before anything is printed.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from sqlqueue_orm import cli, exceptions
from sqlqueue_orm.migration import environment
from sqlqueue_orm.models.queue_table import build_queue_table
from tests.conftest import only
from tests.migration import shapes
from testsupport import legacy

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "postgresql+psycopg://nobody@127.0.0.1:1/none"
HEAD = ScriptDirectory.from_config(environment.alembic_config("sqlite://")).get_current_head()


def _version(engine: sa.engine.Engine) -> list[str]:
    with engine.connect() as connection:
        return list(
            connection.exec_driver_sql("SELECT version_num FROM sqlqueue_alembic_version").scalars()
        )


def _run_script(url: str, script: str) -> None:
    """Run the script as a DBA would: psql with ON_ERROR_STOP (else statement by statement)."""
    psql = shutil.which("psql")
    if psql is not None:
        result = subprocess.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", _libpq(url)],
            input=script,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "ERROR" not in result.stderr, result.stderr
        return
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as connection:
            for statement in script.split(";\n\n"):
                if statement.strip():
                    connection.exec_driver_sql(statement, execution_options={"no_parameters": True})
    finally:
        engine.dispose()


def _libpq(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# -- refusals: nothing printed -------------------------------------------------------------------
@only("sqlite")
def test_sqlite_is_refused_before_anything_is_printed(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--url", database.url, "migrate", "--sql"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "SQL Server and PostgreSQL" in captured.err

    out = io.StringIO()
    with pytest.raises(exceptions.ConfigurationError, match="SQL Server and PostgreSQL"):
        command.upgrade(environment.alembic_config(database.url, stdout=out), "head", sql=True)
    assert out.getvalue() == ""


@pytest.mark.parametrize("tool", ["alembic", "sqlqueue"])
@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        ("sqlite:///{tmp}/q.db", 2, "offline scripts (--sql) are written for "),
        (UNREACHABLE, 1, "cannot read the revision of the database at 127.0.0.1:1 "),
    ],
    ids=["sqlite", "unreachable"],
)
def test_the_console_scripts_refuse_with_one_line_and_print_nothing(
    tmp_path: Path, tool: str, url: str, code: int, says: str
) -> None:
    """As a shell runs them, with their own logging set up: `... > upgrade.sql` stays empty."""
    executable = str(Path(sys.executable).with_name(tool))
    url = url.format(tmp=tmp_path)
    if tool == "alembic":
        argv = [executable, "-x", f"url={url}", "upgrade", "head", "--sql"]
    else:
        argv = [executable, "--url", url, "migrate", "--sql"]
    result = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == code
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"{tool}: error: {says}"), result.stderr


def test_an_unreachable_database_without_a_range_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--url", UNREACHABLE, "migrate", "--sql"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "127.0.0.1:1" in captured.err
    assert "FROM:TO" in captured.err

    assert cli.main(["--url", UNREACHABLE, "migrate", "--sql", "--downgrade", "base"]) == 1
    assert capsys.readouterr().out == ""


def test_a_failure_midway_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    # The PostgreSQL writer refuses a name holding its dollar-quote tag: by then the version
    # table and the first revision's header were written (to memory).
    queue = "odd$sqlqueue$name"
    code = cli.main(
        ["--url", UNREACHABLE, "migrate", "--sql", "--revision", "base:head", "--queues", queue]
    )
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert "$sqlqueue$" in captured.err


# -- PostgreSQL: the script fits the database -----------------------------------------------------
@only("postgresql")
def test_a_database_at_head_gets_a_script_that_changes_nothing(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with database.engine.begin() as connection:
        legacy.create(connection, "v1", "v1 q", None)
        legacy.insert(connection, "v1 q", None, legacy.messages(50, seed=1))
    assert cli.main(["--url", database.url, "migrate"]) == 0
    with database.engine.connect() as connection:
        before = (
            shapes.describe(connection, "v1 q", None),
            legacy.snapshot(connection, "v1 q", None),
        )
    capsys.readouterr()

    assert cli.main(["--url", database.url, "migrate", "--sql"]) == 0
    script = capsys.readouterr().out
    assert "sqlqueue_alembic_version" not in script  # no CREATE TABLE of an existing table
    assert "Running upgrade" not in script

    _run_script(database.url, script)
    assert _version(database.engine) == [HEAD]
    with database.engine.connect() as connection:
        after = (
            shapes.describe(connection, "v1 q", None),
            legacy.snapshot(connection, "v1 q", None),
        )
    assert after == before


@only("postgresql")
def test_a_database_at_an_older_revision_gets_only_the_later_steps(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with database.engine.begin() as connection:
        legacy.create(connection, "v1", "v1 q", None)
        legacy.insert(connection, "v1 q", None, legacy.messages(50, seed=1))
        before = legacy.snapshot(connection, "v1 q", None)
    command.upgrade(environment.alembic_config(database.url), "0002_headers_nvarchar")
    capsys.readouterr()

    assert cli.main(["--url", database.url, "migrate", "--sql"]) == 0
    script = capsys.readouterr().out
    assert "CREATE TABLE sqlqueue_alembic_version" not in script
    assert "-> 0001_expires_index" not in script
    assert "-> 0002_headers_nvarchar" not in script
    assert "Running upgrade 0002_headers_nvarchar -> 0003_filter_expires_index" in script
    assert f"-> {HEAD}" in script

    _run_script(database.url, script)
    assert _version(database.engine) == [HEAD]
    with database.engine.begin() as connection:
        connection.execute(sa.schema.CreateSchema("fresh"))
        build_queue_table(sa.MetaData(), "v1 q", "fresh", connection.dialect).create(connection)
    with database.engine.connect() as connection:
        expected = shapes.describe(connection, "v1 q", "fresh")
        if connection.dialect.name == "postgresql":
            # Legacy rows carry CorrelationIds, so revision 0008 keeps that column (correlationid).
            expected = shapes.with_kept_correlation_id(expected)
        assert shapes.describe(connection, "v1 q", None) == expected
        assert legacy.snapshot(connection, "v1 q", None) == before


@only("postgresql")
def test_an_explicit_range_is_used_as_given(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    command.upgrade(environment.alembic_config(database.url), "head")
    capsys.readouterr()
    assert (
        cli.main(
            [
                "--url",
                database.url,
                "migrate",
                "--sql",
                "--revision",
                "0003_filter_expires_index:0004_rowversion_layout",
            ]
        )
        == 0
    )
    script = capsys.readouterr().out
    assert script.count("Running upgrade") == 1
    assert "Running upgrade 0003_filter_expires_index -> 0004_rowversion_layout" in script


@only("postgresql")
def test_an_offline_downgrade_starts_from_the_database_revision(
    database: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    command.upgrade(environment.alembic_config(database.url), "0004_rowversion_layout")
    capsys.readouterr()
    assert (
        cli.main(
            ["--url", database.url, "migrate", "--sql", "--downgrade", "0002_headers_nvarchar"]
        )
        == 0
    )
    script = capsys.readouterr().out
    assert script.count("Running downgrade") == 2
    assert "Running downgrade 0004_rowversion_layout -> 0003_filter_expires_index" in script
    _run_script(database.url, script)
    assert _version(database.engine) == ["0002_headers_nvarchar"]


@pytest.mark.parametrize(
    ("url", "where"),
    [(UNREACHABLE, "127.0.0.1:1"), ("sqlite:////nonexistent-dir/q.db", "/nonexistent-dir/q.db")],
    ids=["postgresql", "sqlite"],
)
def test_an_unreachable_database_online_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], url: str, where: str
) -> None:
    assert cli.main(["--url", url, "migrate"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert f"migrate: the database at {where}: " in captured.err
