"""What the hot path keeps between calls never leaks: statements, the held cursor, autocommit.

A thread keeps one pooled connection for the transport's own statements, with one cursor, left
in the driver's autocommit between single statements; receives are rendered once per row limit;
a Connection's listeners are looked up only when it has some of its own. Each cache is checked
against what it could get wrong: two queues, a table dropped and recreated, a failed or killed
statement, a batch after single statements, the connection going back to the pool.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from sqlqueue_orm import OutgoingMessage, db, exceptions
from tests.conftest import only


def _bodies(messages):  # type: ignore[no-untyped-def]
    return [message.body for message in messages]


def test_two_queues_do_not_share_statements(database):
    transport = database.transport()
    for name in ("first", "second"):
        transport.create_queue(name)
    for number in range(4):
        transport.send("first", OutgoingMessage(b"first-%d" % number))
        transport.send("second", OutgoingMessage(b"second-%d" % number))
    with database.engine.begin() as connection:  # the caller's path, limits 1 and 3
        assert _bodies(transport.receive("second", 1, connection=connection)) == [b"second-0"]
        assert _bodies(transport.receive("first", 3, connection=connection)) == [
            b"first-0", b"first-1", b"first-2",
        ]
    assert _bodies(transport.receive("first", 3)) == [b"first-3"]  # our own path, same limit
    assert _bodies(transport.receive("second", 1)) == [b"second-1"]
    assert _bodies(transport.receive("second", 3)) == [b"second-2", b"second-3"]
    assert transport.receive("first", 3) == []


def test_a_dropped_and_recreated_queue_table_still_works(database):
    """Cached statements (and PostgreSQL's prepared ones) follow the table, not its old oid."""
    transport = database.transport()
    transport.create_queue("reborn")
    for number in range(8):  # psycopg prepares a statement after 5 runs
        transport.send("reborn", OutgoingMessage(b"%d" % number))
        with database.engine.begin() as connection:
            transport.receive("reborn", connection=connection)
    transport.send("reborn", OutgoingMessage(b"left behind"))
    table = transport.queues.table_queue("reborn").quoted_table.replace("%%", "%")
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f"DROP TABLE {table}")
    with pytest.raises(exceptions.QueueNotFound):
        transport.receive("reborn")
    with pytest.raises(exceptions.QueueNotFound):
        transport.send("reborn", OutgoingMessage(b"nowhere"))
    transport.create_queue("reborn")  # the failed statements left the thread's connection usable
    transport.send("reborn", OutgoingMessage(b"new"))
    assert _bodies(transport.receive("reborn")) == [b"new"]
    transport.send("reborn", OutgoingMessage(b"newer"))
    with database.engine.begin() as connection:
        assert _bodies(transport.receive("reborn", connection=connection)) == [b"newer"]


def test_a_batch_after_single_statements_is_still_all_or_none(database):
    """The held connection left in autocommit goes back to a transaction for ``send_many``."""
    transport = database.transport()
    transport.create_queue("batch")
    transport.send("batch", OutgoingMessage(b"single"))  # autocommit, left on while held
    assert _bodies(transport.receive("batch")) == [b"single"]
    table = transport.queues.table_queue("batch").quoted_table.replace("%%", "%")
    with database.engine.begin() as connection:  # the second row of the batch will fail
        if database.dialect == "sqlite":
            connection.exec_driver_sql(
                f"CREATE TRIGGER refuse_bad BEFORE INSERT ON {table} "
                "WHEN NEW.\"Body\" = X'626164' BEGIN SELECT RAISE(ABORT, 'bad body'); END"
            )
        else:
            connection.exec_driver_sql(
                f"ALTER TABLE {table} ADD CONSTRAINT refuse_bad CHECK (body <> 'bad'::bytea)"
            )
    with pytest.raises(exceptions.DatabaseError):
        transport.send_many("batch", [OutgoingMessage(b"good"), OutgoingMessage(b"bad")])
    assert transport.receive("batch", 10) == []  # the good row went with the bad one
    transport.send("batch", OutgoingMessage(b"after"))  # and the connection still works
    assert _bodies(transport.receive("batch", 10)) == [b"after"]


def test_the_thread_connection_goes_back_to_the_pool_as_it_came(database):
    transport = database.transport()
    transport.create_queue("back")
    transport.send("back", OutgoingMessage(b"one"))
    held = transport._connections._local.held
    driver = held.driver
    cursor = held.cursor
    assert cursor is not None  # kept between statements
    transport.send("back", OutgoingMessage(b"two"))
    assert held.cursor is cursor
    transport.close()
    if database.dialect == "postgresql":
        assert driver.autocommit is False
    with database.engine.connect() as connection:
        assert len(transport.receive("back", 5, connection=connection)) == 2
        connection.rollback()  # not committed: the messages must still be there
    assert _bodies(transport.receive("back", 5)) == [b"one", b"two"]


def test_a_listener_on_one_connection_sees_the_receive_on_it(database):
    """Listeners on a Connection itself (not its engine) still route statements through it."""
    transport = database.transport()
    transport.create_queue("listened")
    transport.send("listened", OutgoingMessage(b"one"))
    transport.receive("listened", 1)  # the probes are done before we listen
    transport.send("listened", OutgoingMessage(b"two"))
    seen: list[str] = []
    with database.engine.begin() as connection:
        event.listen(
            connection,
            "before_cursor_execute",
            lambda conn, cursor, statement, *rest: seen.append(statement),
        )
        assert _bodies(transport.receive("listened", connection=connection)) == [b"two"]
    assert [s for s in seen if "DELETE" in s.upper()], seen


@only("postgresql")
def test_a_killed_thread_connection_is_not_pooled_again(database, postgres_admin):
    """The server ends the held connection: one transient error, then a new connection."""
    engine = db.create_engine(database.url, pool_size=2, max_overflow=0)  # holds 1
    try:
        from sqlqueue_orm import OutgoingMessage, Transport

        transport = Transport(engine)
        transport.create_queue("killed")
        transport.send("killed", OutgoingMessage(b"one"))
        pid = transport._connections._local.held.driver.info.backend_pid
        with postgres_admin.connect() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(exceptions.DatabaseError) as raised:
            transport.receive("killed")
        assert raised.value.transient
        assert _bodies(transport.receive("killed")) == [b"one"]
        transport.send("killed", OutgoingMessage(b"two"))
        with engine.begin() as connection:  # the pool's only connection is a live one
            assert _bodies(transport.receive("killed", connection=connection)) == [b"two"]
        transport.close()
    finally:
        engine.dispose()


def test_an_in_memory_sqlite_transport_sends_and_receives() -> None:
    """``sqlite://`` gets SQLAlchemy's SingletonThreadPool, whose ``size`` is not a method."""
    from sqlqueue_orm import OutgoingMessage, Transport

    transport = Transport("sqlite://")
    transport.create_queue("memory")
    transport.send("memory", OutgoingMessage(b"kept"))
    [message] = transport.receive("memory")
    assert message.body == b"kept"
    assert transport.receive("memory") == []
    transport.engine.dispose()


@only("postgresql")
def test_a_peek_on_a_killed_thread_connection_reads_again_on_a_new_one(database, postgres_admin):
    """A peek is a read: the held connection dying under it costs a retry, not an error."""
    from sqlqueue_orm import OutgoingMessage, Transport

    transport = Transport(database.engine)
    try:
        transport.create_queue("peeked")
        transport.send("peeked", OutgoingMessage(b"one"))
        assert transport.peek("peeked") == 1
        pid = transport._connections._local.held.driver.info.backend_pid
        with postgres_admin.connect() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        assert transport.peek("peeked") == 1
        new_pid = transport._connections._local.held.driver.info.backend_pid
        assert new_pid != pid
    finally:
        transport.close()


@only("postgresql")
def test_an_unreachable_server_raises_sqlalchemys_error_from_the_kept_connection(database):
    """The pump's circuit breakers catch SQLAlchemy's errors: connecting must raise one."""
    from sqlqueue_orm import Transport

    url = sa.make_url(database.url).set(port=1)  # nothing listens there
    transport = Transport(db.create_engine(url))
    try:
        with pytest.raises((sa.exc.DBAPIError, exceptions.DatabaseError)) as raised:
            transport.peek("anything")
        assert "port 1 failed" in str(raised.value)
    finally:
        transport.close()
