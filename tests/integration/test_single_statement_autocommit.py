"""A send of one message or a receive without ``connection=`` costs one statement, no BEGIN/COMMIT.

One statement is atomic on its own, so the transport's own path runs it in autocommit; a batch
(``executemany``, not atomic in autocommit) keeps its transaction. What reaches the database is
read from the driver itself (sqlite3's trace callback, libpq's protocol trace), not from a mock.
The receive's row limit is written into its text, so PostgreSQL plans it once, generically.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.queuing.floor import ReceiveFloor
from tests.conftest import only


def _held_driver_connection(transport: Transport) -> Any:
    """The DBAPI connection this thread keeps for the transport's own statements."""
    return transport._connections._local.held.driver


@contextlib.contextmanager
def _traced(transport: Transport) -> Iterator[list[str]]:
    """Statements the thread's held connection sends while the block runs."""
    driver = _held_driver_connection(transport)
    seen: list[str] = []
    if transport.engine.dialect.name == "sqlite":
        driver.set_trace_callback(seen.append)
        try:
            yield seen
        finally:
            driver.set_trace_callback(None)
        return
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "libpq.trace")
        with open(path, "w") as trace:
            driver.pgconn.trace(trace.fileno())
            try:
                yield seen
            finally:
                driver.pgconn.untrace()
        with open(path) as trace:
            # One round trip per frontend Query (simple protocol: psycopg's BEGIN and COMMIT)
            # or Sync (extended protocol: Parse, Bind, Execute, Sync; no Parse once prepared).
            parsed = "EXECUTE (prepared)"
            for line in trace:
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 4 or fields[1] != "F":
                    continue
                if fields[3] == "Query":
                    seen.append(re.sub(r'^ "|"$', "", fields[4]))
                elif fields[3] == "Parse":
                    parsed = re.sub(r'^ "[^"]*" "|" [\d ]*$', "", fields[4])
                elif fields[3] == "Sync":
                    seen.append(parsed)
                    parsed = "EXECUTE (prepared)"


def _transaction_statements(statements: list[str]) -> list[str]:
    return [s for s in statements if s.strip().upper().split(" ")[0] in ("BEGIN", "COMMIT")]


def test_send_and_receive_without_connection_run_in_autocommit(database):
    transport = database.transport()
    transport.create_queue("single")
    transport.send("single", OutgoingMessage(b"warm-up"))  # the thread now holds a connection
    transport.receive("single")
    with _traced(transport) as seen:
        transport.send("single", OutgoingMessage(b"one"))
        [message] = transport.receive("single")
    assert message.body == b"one"
    assert _transaction_statements(seen) == [], seen
    assert len(seen) == 2, seen  # one round trip each


def test_send_many_keeps_its_transaction(database):
    transport = database.transport()
    transport.create_queue("batch")
    transport.send("batch", OutgoingMessage(b"warm-up"))
    transport.receive("batch")
    with _traced(transport) as seen:
        transport.send_many("batch", [OutgoingMessage(b"a"), OutgoingMessage(b"b")])
    assert [s.split(" ")[0].upper() for s in _transaction_statements(seen)] == [
        "BEGIN",
        "COMMIT",
    ], seen
    assert [m.body for m in transport.receive("batch", 5)] == [b"a", b"b"]


def test_autocommit_does_not_leak_into_the_pool(database):
    """The connection a thread held goes back to the pool with transactions as they were."""
    transport = database.transport()
    transport.create_queue("leak")
    transport.send("leak", OutgoingMessage(b"one"))
    transport.close()  # the held connection goes back to the pool
    with database.engine.connect() as connection:
        assert len(transport.receive("leak", connection=connection)) == 1
        connection.rollback()  # not committed: the message must still be there
    assert [m.body for m in transport.receive("leak")] == [b"one"]


@only("postgresql")
def test_receive_gets_a_generic_plan(database):
    """With the row limit written in, the prepared receive is planned once, not per call.

    Its one parameter, the receive floor (``queuing/floor.py``), gets PostgreSQL's rule for a
    prepared statement with parameters: the first five runs planned for their values, then the
    generic plan on every run (a bound row limit kept it on custom plans for good).
    """
    transport = database.transport()
    transport.create_queue("planned")
    transport.send_many("planned", [OutgoingMessage(b"x") for _ in range(60)])
    queue = transport.queues.table_queue("planned")
    queue.floor = ReceiveFloor(queue.name, margin=2)  # a new floor value on every receive
    with database.engine.connect() as connection:
        for _ in range(25):  # psycopg prepares after 5 runs; PostgreSQL picks a plan after 5
            with connection.begin():
                transport.receive("planned", 3, connection=connection)
        [(generic, custom)] = connection.exec_driver_sql(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'DELETE FROM %%planned%%'"
        ).all()
        connection.rollback()
    assert queue.floor.position > 50
    assert custom <= 5 and generic >= 15, (generic, custom)
