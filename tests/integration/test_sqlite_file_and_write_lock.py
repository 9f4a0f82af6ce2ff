"""SQLite's file and its one write lock, as a user meets them.

* Another process holds the write lock: a send waits for it, says after about a second that it
  waits (a log line naming the file), and when the busy timeout (``?timeout=`` in the URL) runs
  out fails with :class:`DatabaseLocked` naming the file and what to do; the CLI prints both
  lines and exits 1.
* Reads (peek, browse, list-queues, verify, a queue's first use) take no write lock: they run
  while another process writes.
* A mistyped file: the commands that create nothing say it does not exist, and create nothing;
  ``create-queue`` creates it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sqlqueue_orm import OutgoingMessage, Transport, UnitOfWork, db, exceptions, verify
from sqlqueue_orm.dialects import sqlite as sqlite_dialect
from tests.conftest import Database, only
from tests.integration.test_cli import sqlqueue

#: The busy timeout of the URLs below: long enough to see the waiting line, short for a test.
TIMEOUT_S = 3


@contextmanager
def write_lock_held(path: str) -> Iterator[None]:
    """Another connection holds *path*'s write lock (with a row not yet committed)."""
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute('INSERT INTO "orders" ("Id", "Recoverable", "Headers", "Body") '
                       "VALUES ('00000000000000000000000000000001', 1, '{}', x'00')")
        yield
    finally:
        holder.rollback()
        holder.close()


def _file(database: Database) -> str:
    path = database.engine.url.database
    assert path is not None
    return path


def _url(database: Database) -> str:
    return f"{database.url}?timeout={TIMEOUT_S}"


@only("sqlite")
def test_a_send_waits_says_so_and_fails_naming_the_file(database, caplog):
    database.transport().create_queue("orders")
    path = _file(database)
    with Transport(_url(database)) as transport, write_lock_held(path):
        transport.peek("orders")  # the queue is known: the send is the only wait
        with caplog.at_level(logging.INFO):
            started = time.monotonic()
            with pytest.raises(exceptions.DatabaseLocked) as raised:
                transport.send("orders", OutgoingMessage(b"x"))
            waited = time.monotonic() - started
        with pytest.raises(exceptions.DatabaseLocked):
            with UnitOfWork(transport) as unit:
                unit.send("orders", OutgoingMessage(b"y"))
    assert isinstance(raised.value, exceptions.DatabaseError)
    assert raised.value.transient
    assert TIMEOUT_S - 0.5 < waited < TIMEOUT_S + 5
    assert path in str(raised.value)
    assert "another process" in str(raised.value)
    waiting = [record.getMessage() for record in caplog.records if "waiting" in record.getMessage()]
    assert waiting and path in waiting[0]
    # the lock is free again: the same transport sends
    with Transport(_url(database)) as transport:
        transport.send("orders", OutgoingMessage(b"z"))
        assert [message.body for message in transport.receive("orders")] == [b"z"]


@only("sqlite")
def test_the_cli_says_it_waits_then_names_the_file_in_one_line(database):
    database.transport().create_queue("orders")
    path = _file(database)
    with write_lock_held(path):
        result = sqlqueue(_url(database), "send", "orders", "--body", "x", check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr
    assert any("waiting" in line and path in line for line in lines[:-1])
    assert lines[-1].startswith("sqlqueue: error: ")
    assert path in lines[-1] and "another process" in lines[-1]


@only("sqlite")
def test_reads_run_while_another_process_writes(database):
    setup = database.transport()
    setup.create_queue("orders")
    setup.send("orders", OutgoingMessage(b"first"))
    path = _file(database)
    with write_lock_held(path):
        started = time.monotonic()
        with Transport(_url(database)) as transport:  # a new one: its queue's first use too
            assert [message.body for message in transport.browse("orders")] == [b"first"]
            assert transport.peek("orders") == 1
            assert dict(transport.list_queues())["orders"] == 1
            with db.reading(transport.engine) as connection:
                assert verify.verify(connection) == []
        assert time.monotonic() - started < TIMEOUT_S - 1
        for command in (["peek", "orders"], ["browse", "orders"], ["list-queues"], ["verify"]):
            result = sqlqueue(_url(database), *command, check=False)
            assert "locked" not in result.stderr, (command, result.stderr)
            assert result.returncode == 0, (command, result.stderr)


def test_a_mistyped_file_is_not_created_by_commands_that_create_nothing(tmp_path):
    path = tmp_path / "typo.db"
    url = f"sqlite:///{path}"
    for command in (
        ["receive", "orders"],
        ["peek", "orders"],
        ["browse", "orders"],
        ["send", "orders", "--body", "x"],
        ["list-queues"],
        ["verify"],
        ["errors", "list"],
    ):
        result = sqlqueue(url, *command, check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1, (command, result.stderr)
        assert len(lines) == 1 and str(path) in lines[0] and "does not exist" in lines[0], (
            command, result.stderr)
        assert os.listdir(tmp_path) == [], command
    assert sqlqueue(url, "create-queue", "orders").returncode == 0
    assert path.exists()
    assert sqlqueue(url, "peek", "orders").stdout.strip() == "0"


@only("sqlite")
def test_only_statements_that_can_take_the_write_lock_run_through_the_waiting_cursor(database):
    transport = database.transport()
    transport.create_queue("orders")
    for begin in (transport.begin, database.engine.begin):
        with begin() as connection:  # BEGIN IMMEDIATE holds the lock: nothing in it waits
            assert type(connection.connection.cursor()) is sqlite3.Cursor
            transport.send("orders", OutgoingMessage(b"x"), connection=connection)
    with db.reading(transport.engine) as connection, connection.begin():
        assert type(connection.connection.cursor()) is sqlite3.Cursor  # BEGIN never wants it
    raw = database.engine.raw_connection()
    try:  # outside a transaction: BEGIN IMMEDIATE, or a write in autocommit, may wait
        assert type(raw.cursor()) is sqlite_dialect.WaitingCursor
    finally:
        raw.close()
    assert [message.body for message in transport.receive("orders", 5)] == [b"x", b"x"]



@only("sqlite")
def test_transactions_begin_immediate_except_reads_without_an_event_listener(database):
    """Writing transactions take the write lock up front, reading ones do not, on one pooled
    connection in turn; and no engine-level listener makes every Connection pay SQLAlchemy's
    event dispatch (each ``engine.begin()`` and each kept connection's block)."""
    engine = db.create_engine(database.url)
    try:
        assert not engine._has_events  # the flag SQLAlchemy checks on every Connection
        statements: list[str] = []
        with engine.connect() as connection:  # the pool's one connection, traced from now on
            connection.connection.driver_connection.set_trace_callback(statements.append)
        for _ in range(2):
            with engine.connect() as connection, connection.begin():
                pass
            with db.reading(engine) as connection:
                with connection.begin():
                    pass
                with connection.begin():  # the same Connection reads again
                    pass
            with engine.begin():  # back in the pool: a writer again
                pass
        assert engine.pool.checkedin() == 1  # one pooled connection served every block
        begins = [statement for statement in statements if statement.startswith("BEGIN")]
        assert begins == ["BEGIN IMMEDIATE", "BEGIN", "BEGIN", "BEGIN IMMEDIATE"] * 2
    finally:
        engine.dispose()
