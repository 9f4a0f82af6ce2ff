"""Revision 0009_delayed_delivery: delayed tables without their Due index get it, rows intact.

A delayed table made without the index (an older NServiceBus, or by hand) is found by its
columns, whatever its name, and gets the index as the transport names it; queue tables and
other tables are left alone; running again changes nothing. PostgreSQL also runs the offline
script for real (the T-SQL script is a golden file in tests/tsql/test_delayed_delivery.py).
"""

from __future__ import annotations

import io

import sqlalchemy as sa
from alembic import command

from sqlqueue_orm import OutgoingMessage, cli
from sqlqueue_orm.migration import environment
from sqlqueue_orm.models.queue_table import index_name
from tests.conftest import only

#: Odd names on purpose: found by columns, not by the ".Delayed" suffix.
TABLE = "sales.Waiting room"


def _legacy_delayed_table(database) -> None:  # type: ignore[no-untyped-def]
    """The delayed table's columns with no index at all, and two rows."""
    if database.dialect == "postgresql":
        ddl = (
            f'CREATE TABLE "{TABLE}" (id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY, '
            "headers text NOT NULL, body bytea, due timestamptz NOT NULL)"
        )
        insert = f'INSERT INTO "{TABLE}" (headers, body, due) VALUES (:h, :b, now())'
    else:
        ddl = (
            f'CREATE TABLE "{TABLE}" ("Headers" TEXT NOT NULL, "Body" BLOB, '
            '"Due" DATETIME NOT NULL, "RowVersion" INTEGER PRIMARY KEY AUTOINCREMENT)'
        )
        insert = (
            f'INSERT INTO "{TABLE}" ("Headers", "Body", "Due") '
            "VALUES (:h, :b, '2026-01-01 00:00:00.000')"
        )
    with database.engine.begin() as connection:
        connection.exec_driver_sql(ddl)
        for number in range(2):
            connection.execute(sa.text(insert), {"h": f'{{"n":"{number}"}}', "b": bytes([number])})


def _due_indexes(database, table: str = TABLE) -> list[str]:  # type: ignore[no-untyped-def]
    due = "due" if database.dialect == "postgresql" else "Due"
    indexes = sa.inspect(database.engine).get_indexes(table)
    return sorted(str(i["name"]) for i in indexes if i["column_names"][:1] == [due])


def _rows(database) -> list[tuple[object, ...]]:  # type: ignore[no-untyped-def]
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.exec_driver_sql(f'SELECT * FROM "{TABLE}"')]


def _expected_name(database) -> str:  # type: ignore[no-untyped-def]
    base = "Due" if database.dialect == "postgresql" else "Index_Due"
    return index_name(TABLE, base, database.dialect)


@only("sqlite", "postgresql")
def test_a_delayed_table_without_its_due_index_gets_it(database):
    _legacy_delayed_table(database)
    transport = database.transport()
    transport.create_queue("sales")  # a queue table: never taken for a delayed one
    transport.send("sales", OutgoingMessage(b"queued"))
    before = _rows(database)
    assert _due_indexes(database) == []
    assert cli.main(["--url", database.url, "migrate"]) == 0
    assert _due_indexes(database) == [_expected_name(database)]
    assert _rows(database) == before
    command.upgrade(environment.alembic_config(database.url), "head")  # again: nothing to do
    assert _due_indexes(database) == [_expected_name(database)]
    assert [message.body for message in transport.receive("sales")] == [b"queued"]


@only("sqlite", "postgresql")
def test_a_delayed_table_created_by_an_endpoint_is_left_as_it_is(database):
    transport = database.transport()
    transport.create_delayed_table("sales")
    table = str(transport.queues.delayed_address("sales").table)
    before = _due_indexes(database, table)
    assert len(before) == 1
    assert cli.main(["--url", database.url, "migrate"]) == 0
    assert _due_indexes(database, table) == before


@only("postgresql")
def test_the_offline_script_creates_the_index_on_postgresql_twice_in_a_row(database):
    _legacy_delayed_table(database)
    out = io.StringIO()
    config = environment.alembic_config(database.url, stdout=out)
    command.upgrade(config, "0008_postgresql_nsb_layout:0009_delayed_delivery", sql=True)
    script = out.getvalue()
    script = script.replace("UPDATE sqlqueue_alembic_version", "-- UPDATE sqlqueue_alembic_version")
    before = _rows(database)
    for _ in range(2):
        with database.engine.connect() as connection:
            connection.connection.driver_connection.execute(script)  # type: ignore[union-attr]
    assert _due_indexes(database) == [_expected_name(database)]
    assert _rows(database) == before
