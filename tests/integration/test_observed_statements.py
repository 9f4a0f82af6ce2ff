"""SQLAlchemy's cursor events see every send and receive, with and without ``connection=``.

``echo=True`` and tracing instrumentation (OpenTelemetry's SQLAlchemy instrumentation listens to
``before_cursor_execute``) must see the statements of the transport's own short transactions too,
not only those run on a caller's connection.
"""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import event

from sqlqueue_orm import OutgoingMessage


def _listen(engine, seen):  # type: ignore[no-untyped-def]
    def before(connection, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    return before


def _sends(statements):  # type: ignore[no-untyped-def]
    return [s for s in statements if s.lstrip().upper().startswith("INSERT") and "observed" in s]


def _receives(statements):  # type: ignore[no-untyped-def]
    return [s for s in statements if "DELETE" in s.upper() and "observed" in s]


@pytest.mark.parametrize("with_connection", [False, True], ids=["own", "caller"])
def test_cursor_listener_sees_send_and_receive(database, with_connection):
    transport = database.transport()
    transport.create_queue("observed")
    transport.send("observed", OutgoingMessage(b"warm-up"))  # probes done before we listen
    transport.receive("observed")
    seen: list[str] = []
    listener = _listen(database.engine, seen)
    try:
        if with_connection:
            with database.engine.begin() as connection:
                transport.send("observed", OutgoingMessage(b"one"), connection=connection)
            with database.engine.begin() as connection:
                [message] = transport.receive("observed", connection=connection)
        else:
            transport.send("observed", OutgoingMessage(b"one"))
            [message] = transport.receive("observed")
    finally:
        event.remove(database.engine, "before_cursor_execute", listener)
    assert message.body == b"one"
    assert len(_sends(seen)) == 1, seen
    assert len(_receives(seen)) == 1, seen
    # With nobody listening, the fast path runs again and the listener saw nothing more.
    count = len(seen)
    transport.send("observed", OutgoingMessage(b"two"))
    assert [m.body for m in transport.receive("observed")] == [b"two"]
    assert len(seen) == count


@pytest.mark.parametrize("with_connection", [False, True], ids=["own", "caller"])
def test_sql_logging_shows_send_and_receive(database, caplog, with_connection):
    transport = database.transport()
    transport.create_queue("observed")
    transport.send("observed", OutgoingMessage(b"warm-up"))
    transport.receive("observed")
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
        if with_connection:
            with database.engine.begin() as connection:
                transport.send("observed", OutgoingMessage(b"one"), connection=connection)
                received = transport.receive("observed", connection=connection)
        else:
            transport.send("observed", OutgoingMessage(b"one"))
            received = transport.receive("observed")
    assert [m.body for m in received] == [b"one"]
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy.engine")]
    assert _sends(logged) and _receives(logged), logged


def test_listener_sees_statements_of_other_threads(database):
    transport = database.transport()
    transport.create_queue("observed")
    transport.send("observed", OutgoingMessage(b"warm-up"))
    transport.receive("observed")
    seen: list[str] = []
    listener = _listen(database.engine, seen)
    try:
        worker = threading.Thread(
            target=lambda: transport.send("observed", OutgoingMessage(b"from a thread"))
        )
        worker.start()
        worker.join()
    finally:
        event.remove(database.engine, "before_cursor_execute", listener)
    assert len(_sends(seen)) == 1
    assert [m.body for m in transport.receive("observed")] == [b"from a thread"]
