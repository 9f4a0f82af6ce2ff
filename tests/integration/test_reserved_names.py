"""The database's own tables are never queues: a reserved name is refused before any SQL runs.

SQLite keeps its catalog in ``sqlite_*`` tables, PostgreSQL in ``pg_*`` schemas and tables and
``information_schema``, SQL Server in the ``sys`` and ``INFORMATION_SCHEMA`` schemas. Creating,
sending to or receiving from a queue so named raises :class:`InvalidQueueName` naming it; the
command line says so in one line and exits 2.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sqlqueue_orm import OutgoingMessage, QueueAddress, exceptions

RESERVED = {
    "sqlite": [QueueAddress("sqlite_master"), QueueAddress("sqlite_sequence"),
               QueueAddress("SQLite_Stat1")],
    "postgresql": [QueueAddress("pg_class"), QueueAddress("orders", "pg_catalog"),
                   QueueAddress("pg_class", "pg_catalog"), QueueAddress("orders", "pg_toast"),
                   QueueAddress("tables", "information_schema")],
    "mssql": [QueueAddress("objects", "sys"), QueueAddress("tables", "INFORMATION_SCHEMA"),
              QueueAddress("orders", "Sys")],
}


def sqlqueue(url, *args):  # type: ignore[no-untyped-def]
    env = {**os.environ, "SQLQUEUE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "sqlqueue_orm.cli", *args], capture_output=True, text=True,
        check=False, env=env, timeout=120,
    )


def test_reserved_names_are_refused_by_the_api(database):
    transport = database.transport()
    for address in RESERVED[database.dialect]:
        for attempt, args in (
            (transport.create_queue, (address,)),
            (transport.send, (address, OutgoingMessage(b"x"))),
            (transport.receive, (address, 1)),
            (transport.browse, (address,)),
        ):
            with pytest.raises(exceptions.InvalidQueueName, match=address.table):
                attempt(*args)


def test_a_user_table_beside_the_reserved_ones_is_a_queue(database):
    transport = database.transport()
    name = {"sqlite": "my_sqlite_master", "postgresql": "orders_pg_class",
            "mssql": "sys_orders"}[database.dialect]
    assert transport.create_queue(name) is True
    transport.send(name, OutgoingMessage(b"x"))
    assert [message.body for message in transport.receive(name, 5)] == [b"x"]


def test_the_cli_refuses_a_reserved_name_in_one_line_exit_2(database):
    address = str(RESERVED[database.dialect][0])
    for args in (
        ("create-queue", address),
        ("send", address, "--body", "x"),
        ("receive", address),
        ("browse", address),
    ):
        result = sqlqueue(database.url, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert RESERVED[database.dialect][0].table in lines[0]
        assert "reserved" in lines[0]
