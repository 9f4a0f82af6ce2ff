"""A PostgreSQL queue table still in the layout before revision 0008 says "run `sqlqueue migrate`".

Send and receive always said so (SchemaOutdated). Peek, browse, list-queues and the dashboard
said "the table's columns changed under us; retry" (a transient error, retried for nothing) or
showed the driver's UndefinedColumn. Every path now names the outdated table and the fix.
"""

from __future__ import annotations

import pytest

from sqlqueue_orm import exceptions
from tests.conftest import only
from tests.integration.test_cli import one_line, sqlqueue
from testsupport import legacy

TABLE = "old orders"


@pytest.fixture
def old_table(database):  # type: ignore[no-untyped-def]
    with database.engine.begin() as connection:
        legacy.create(connection, "3.1", TABLE, None)
        legacy.insert(connection, TABLE, None, legacy.messages(3, seed=1))
    return database


def _says_migrate(text: str) -> None:
    assert "outdated" in text and "sqlqueue migrate" in text, text
    assert TABLE in text, text
    assert "retry" not in text and "UndefinedColumn" not in text, text


@only("postgresql")
def test_the_api_says_migrate_on_every_path(old_table):
    transport = old_table.transport()
    for read in (
        lambda: transport.peek(TABLE),
        lambda: transport.browse(TABLE),
        lambda: transport.list_queues(),
        lambda: transport.receive(TABLE),
    ):
        with pytest.raises(exceptions.SchemaOutdated) as raised:
            read()
        _says_migrate(str(raised.value))
    with old_table.engine.begin() as connection:  # on the caller's connection too
        with pytest.raises(exceptions.SchemaOutdated):
            transport.peek(TABLE, connection=connection)


@only("postgresql")
@pytest.mark.parametrize("command", [["list-queues"], ["peek", TABLE], ["browse", TABLE]])
def test_the_command_line_says_migrate(old_table, command):
    done = sqlqueue(old_table.url, *command, check=False)
    assert done.returncode == 1, done
    _says_migrate(one_line(done.stderr))


@only("postgresql")
def test_the_dashboard_shows_the_fix_not_503(old_table):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from starlette.testclient import TestClient

    from sqlqueue_orm.contrib.dashboard import create_app

    transport = old_table.transport()
    with TestClient(create_app(transport)) as client:
        for path in ("/", f"/queue?name={TABLE}"):
            page = client.get(path)
            assert page.status_code != 503, (path, page.text)
            assert "sqlqueue migrate" in page.text and "retry;" not in page.text, path
