"""A command a hint suggests runs on the database the user named: it repeats ``--url`` (the
password masked), or ``"$SQLQUEUE_URL"`` when the URL came from there; pasted as it is, it
acts on that database, not on ``./sqlqueue.db``."""

from __future__ import annotations

import shlex

import sqlalchemy as sa

from tests.conftest import only
from tests.integration.cli_process import one_line, shell, sqlqueue


def _hint(stderr: str) -> str:
    """The command after "create it with: " in a one-line error."""
    return one_line(stderr).partition("create it with: ")[2]


@only("sqlite")
def test_the_missing_queue_hint_repeats_the_url_option_and_works_as_pasted(database, tmp_path):
    database.transport().create_queue("elsewhere")  # the database exists; only the queue is missing
    result = sqlqueue("--url", database.url, "send", "nowhere", "--body", "x", cwd=tmp_path)
    assert result.returncode == 2
    hint = _hint(result.stderr)
    assert hint == f"sqlqueue create-queue nowhere --url {shlex.quote(database.url)}"
    assert shell(hint, cwd=tmp_path).returncode == 0
    assert "nowhere" in dict(database.transport().list_queues())
    assert not (tmp_path / "sqlqueue.db").exists()


@only("sqlite")
def test_a_url_from_the_environment_is_named_by_its_variable(database, tmp_path):
    database.transport().create_queue("elsewhere")  # the database exists; only the queue is missing
    result = sqlqueue("receive", "nowhere", cwd=tmp_path, env_url=database.url)
    assert result.returncode == 2
    hint = _hint(result.stderr)
    assert hint == 'sqlqueue create-queue nowhere --url "$SQLQUEUE_URL"'
    assert database.url not in result.stderr
    assert shell(hint, cwd=tmp_path, env_url=database.url).returncode == 0
    assert "nowhere" in dict(database.transport().list_queues())


def test_the_default_database_needs_no_url(tmp_path):
    assert sqlqueue("create-queue", "elsewhere", cwd=tmp_path).returncode == 0
    result = sqlqueue("browse", "nowhere", cwd=tmp_path)
    assert result.returncode == 2
    assert _hint(result.stderr) == "sqlqueue create-queue nowhere"


@only("postgresql")
def test_the_repeated_url_masks_the_password(database, tmp_path):
    # The test cluster trusts local logins: a password is accepted and not needed.
    url = sa.make_url(database.url).set(password="s3cret-word")
    given = url.render_as_string(hide_password=False)
    result = sqlqueue("--url", given, "peek", "nowhere", cwd=tmp_path)
    assert result.returncode == 2
    hint = _hint(result.stderr)
    assert "s3cret-word" not in result.stderr
    assert hint == (
        "sqlqueue create-queue nowhere --url "
        + shlex.quote(url.render_as_string(hide_password=True))
    )
    assert ":***@" in hint


@only("sqlite", "postgresql")
def test_the_migrate_hint_of_a_missing_outbox_table_names_the_database(database, tmp_path):
    result = sqlqueue("--url", database.url, "outbox", "cleanup", cwd=tmp_path)
    assert result.returncode == 1
    shown = shlex.quote(sa.make_url(database.url).render_as_string(hide_password=True))
    assert f"run `sqlqueue migrate --url {shown}`" in one_line(result.stderr)


@only("sqlite")
def test_the_online_migrate_hint_names_the_database(database, tmp_path):
    result = sqlqueue("--url", database.url, "migrate", "--sql", cwd=tmp_path)
    assert result.returncode == 2
    assert f"(`sqlqueue migrate --url {shlex.quote(database.url)}`, or alembic" in one_line(
        result.stderr
    )


@only("sqlite")
def test_the_errors_list_hint_names_the_database_and_the_queue(database, tmp_path):
    database.transport().create_queues(["error", "failures"])
    unknown = "0b0e4b6c-8c4e-4c1e-9f58-6d1b3a2a9f10"
    result = sqlqueue("--url", database.url, "errors", "show", unknown, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line(result.stderr).endswith(
        f"(see: sqlqueue errors list --url {shlex.quote(database.url)})"
    )
    result = sqlqueue(
        "errors", "show", unknown, "--queue", "failures", cwd=tmp_path, env_url=database.url
    )
    assert one_line(result.stderr).endswith(
        '(see: sqlqueue errors list --queue failures --url "$SQLQUEUE_URL")'
    )


@only("sqlite")
def test_a_logged_fix_names_the_database(database, tmp_path):
    """First use warns about an outdated queue table with its fix: `sqlqueue migrate`."""
    transport = database.transport()
    transport.create_queue("orders")
    with database.engine.begin() as connection:
        for index in sa.inspect(connection).get_indexes("orders"):
            if index["column_names"] and index["column_names"][0] == "Expires":
                connection.exec_driver_sql(f'DROP INDEX "{index["name"]}"')
    result = sqlqueue("--url", database.url, "send", "orders", "--body", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "does not contain an index for column 'Expires'" in result.stderr
    assert f"(fix: `sqlqueue migrate --url {shlex.quote(database.url)}`)" in result.stderr
