"""The first use of a queue looks its table up once: schema warnings and probe read one look-up.

Counted with a ``before_cursor_execute`` listener on a real database: the statements a queue's
first send runs before its INSERT, and none on later sends, with or without ``connection=``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.queuing.table_queue import TableQueue


def _catalog(statements: list[str]) -> list[str]:
    """Statements that are not the queue's own (everything but INSERT/DELETE on the queue)."""
    return [s for s in statements if not s.lstrip().upper().startswith(("INSERT", "DELETE"))]


@pytest.fixture
def seen(database):  # type: ignore[no-untyped-def]
    statements: list[str] = []

    def before(connection, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(database.engine, "before_cursor_execute", before)
    yield statements
    event.remove(database.engine, "before_cursor_execute", before)


@pytest.mark.parametrize("verify_schema", [True, False], ids=["verify", "no-verify"])
def test_first_send_looks_the_table_up_once(database, seen, verify_schema):
    database.transport().create_queue("inspected")
    transport = database.transport(verify_schema=verify_schema)
    seen.clear()
    transport.send("inspected", OutgoingMessage(b"one"))
    catalog = _catalog(seen)
    # The same catalog statement twice was the schema check and the probe each looking up
    # the columns (five catalog queries on SQLite, two of them the same).
    assert len(catalog) == len(set(catalog)), catalog
    if not verify_schema:  # the columns only (and PostgreSQL's row-lock privilege)
        assert len(catalog) == (2 if database.dialect == "postgresql" else 1), catalog
    seen.clear()
    transport.send("inspected", OutgoingMessage(b"two"))
    with database.engine.begin() as connection:
        transport.send("inspected", OutgoingMessage(b"three"), connection=connection)
        transport.receive("inspected", 3, connection=connection)
    assert _catalog(seen) == [], seen


def test_first_use_on_a_caller_connection_serves_the_own_path(database, seen):
    database.transport().create_queue("inspected")
    transport = database.transport()
    with database.engine.begin() as connection:
        transport.send("inspected", OutgoingMessage(b"one"), connection=connection)
    catalog = _catalog(seen)
    assert catalog and len(catalog) == len(set(catalog)), catalog
    seen.clear()
    assert [m.body for m in transport.receive("inspected")] == [b"one"]
    assert _catalog(seen) == [], seen


def test_cursor_methods_say_probe_comes_first(database):
    transport = database.transport()
    transport.create_queue("unprobed")
    queue = TableQueue(transport.queues.address("unprobed"), database.engine.dialect)
    raw = database.engine.raw_connection()
    try:
        cursor = raw.cursor()
        with pytest.raises(RuntimeError, match=r"unprobed.*probe"):
            queue.receive_on_cursor(cursor)
        with database.engine.connect() as connection:
            queue.probe(connection)
        assert queue.receive_on_cursor(cursor) == []
    finally:
        raw.rollback()
        raw.close()
