"""``Transport.begin()``: ``engine.begin()``'s guarantee on a connection the thread keeps.

The block's work commits together when it ends, and rolls back together when it raises (a
receive's messages return to their places with the block's own writes undone). The thread
keeps the connection between blocks (no pool checkout per transaction), within the same budget
as the transport's own statements, never after a failure, and gives it back when the thread
ends or the transport closes. A nested block is a transaction of its own, as with
``engine.begin()``. SQLAlchemy's transaction object outlives the block on a kept connection,
but each block is one database transaction: the database is idle between two (SQLite's write
lock free, no PostgreSQL transaction open), a Session bound to the block joins it, and
SQLAlchemy's "begin" and "commit" events fire once per block.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqlqueue_orm import OutgoingMessage, Transport, db, exceptions, keeping
from tests.conftest import only
from tests.integration.support import bodies

_METADATA = sa.MetaData()
_ORDERS = sa.Table(
    "orders_seen",
    _METADATA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("body", sa.LargeBinary),
)


def _sqlite_write_lock_is_free(url: str) -> bool:
    """Whether another SQLite connection can take the write lock now (without waiting)."""
    other = sqlite3.connect(sa.make_url(url).database or "", timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        assert "locked" in str(error), error
        return False
    finally:
        other.close()  # rolls the BEGIN back if it was taken
    return True


def _checkouts(engine: sa.Engine) -> list[int]:
    seen: list[int] = []
    sa.event.listen(engine, "checkout", lambda *args: seen.append(1))
    return seen


def _orders(engine: sa.Engine) -> list[bytes]:
    with engine.connect() as connection:
        return [row[0] for row in connection.execute(sa.select(_ORDERS.c.body).order_by("id"))]


def test_the_block_commits_together_or_rolls_back_together(database):
    transport = database.transport()
    transport.create_queue("kept")
    _METADATA.create_all(database.engine)
    transport.send_many("kept", [OutgoingMessage(body) for body in (b"a", b"b")])
    with pytest.raises(RuntimeError), transport.begin() as connection:
        [message] = transport.receive("kept", connection=connection)
        connection.execute(_ORDERS.insert().values(body=message.body))
        raise RuntimeError("the handler failed")
    assert _orders(database.engine) == []
    with transport.begin() as connection:
        [message] = transport.receive("kept", connection=connection)
        assert message.body == b"a"  # back in its place
        with Session(bind=connection, join_transaction_mode="create_savepoint") as session:
            session.execute(_ORDERS.insert().values(body=message.body))
            session.commit()  # the SAVEPOINT: the block's commit is the one that counts
    assert _orders(database.engine) == [b"a"]
    assert bodies(transport.receive("kept", 5)) == [b"b"]
    transport.close()


def test_blocks_reuse_one_pooled_connection_and_drop_it_after_a_failure(database):
    transport = database.transport()
    transport.create_queue("reused")
    transport.send_many("reused", [OutgoingMessage(b"%d" % number) for number in range(20)])
    checkouts = _checkouts(database.engine)
    got = []
    for _ in range(10):
        with transport.begin() as connection:
            got.extend(transport.receive("reused", connection=connection))
    assert len(checkouts) == 1  # engine.begin() checks one out per transaction
    with pytest.raises(ValueError), transport.begin() as connection:
        transport.receive("reused", connection=connection)
        raise ValueError("anything")
    for _ in range(10):
        with transport.begin() as connection:
            got.extend(transport.receive("reused", connection=connection))
    assert len(checkouts) == 2  # a block that raised gives its connection back
    assert sorted(bodies(got), key=int) == [b"%d" % number for number in range(20)]
    transport.close()
    assert database.engine.pool.checkedout() == 0


def test_a_kept_connection_goes_back_to_the_pool_after_keep_most_blocks(database, monkeypatch):
    """After KEEP_MOST blocks the kept connection is given back and the next block takes
    another, so the pool's own checks (pre-ping, recycle) still see it under steady load."""
    monkeypatch.setattr(keeping, "KEEP_MOST", 4)
    transport = database.transport()
    transport.create_queue("rotated")
    transport.send_many("rotated", [OutgoingMessage(b"%d" % number) for number in range(10)])
    checkouts = _checkouts(database.engine)
    got = []
    for _ in range(10):
        with transport.begin() as connection:
            got.extend(transport.receive("rotated", connection=connection))
    assert len(checkouts) == 3  # blocks 1-4, 5-8 and 9-10
    assert sorted(bodies(got), key=int) == [b"%d" % number for number in range(10)]
    transport.close()
    assert database.engine.pool.checkedout() == 0


def test_the_transports_own_statements_give_their_kept_connection_back_after_keep_most(
    database, monkeypatch
):
    """The connection a thread keeps for sends and receives without ``connection=`` goes back
    to the pool after KEEP_MOST of them too, so pre-ping and recycle still see it."""
    monkeypatch.setattr(keeping, "KEEP_MOST", 4)
    transport = database.transport()
    transport.create_queue("rotated_own")
    transport.send("rotated_own", OutgoingMessage(b"first"))  # the thread takes its connection
    checkouts = _checkouts(database.engine)
    for number in range(12):
        transport.send("rotated_own", OutgoingMessage(b"%d" % number))
    assert 2 <= len(checkouts) <= 4  # a new connection after every four statements at most
    got = []
    while batch := transport.receive("rotated_own", max_messages=5):
        got.extend(batch)
    assert sorted(bodies(got)) == sorted([b"first"] + [b"%d" % n for n in range(12)])
    transport.close()
    assert database.engine.pool.checkedout() == 0


def test_a_thread_that_ends_gives_its_connection_back(database):
    transport = database.transport()
    transport.create_queue("threads")
    transport.send("threads", OutgoingMessage(b"one"))
    got = []

    def work() -> None:
        with transport.begin() as connection:
            got.extend(transport.receive("threads", connection=connection))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    gc.collect()
    assert bodies(got) == [b"one"]
    transport.close()  # gives back the connections of the transport's own statements
    assert database.engine.pool.checkedout() == 0


def test_the_kept_connection_stays_within_the_transports_budget(database):
    """With a pool of 2 the thread keeps one connection in all: others still get the second."""
    engine = db.create_engine(database.url, pool_size=2, max_overflow=0, pool_timeout=5)
    try:
        transport = Transport(engine)
        transport.create_queue("budget")
        transport.send("budget", OutgoingMessage(b"one"))  # the thread keeps a connection
        with transport.begin() as connection:
            assert bodies(transport.receive("budget", connection=connection)) == [b"one"]
        assert engine.pool.checkedout() == 1
        transport.close()
    finally:
        engine.dispose()


@only("postgresql")
def test_a_nested_block_is_a_transaction_of_its_own(database):
    transport = database.transport()
    transport.create_queue("nested")
    transport.send_many("nested", [OutgoingMessage(b"outer"), OutgoingMessage(b"inner")])
    with pytest.raises(RuntimeError), transport.begin() as outer:
        assert bodies(transport.receive("nested", connection=outer)) == [b"outer"]
        with transport.begin() as inner:
            assert inner is not outer
            assert bodies(transport.receive("nested", connection=inner)) == [b"inner"]
        raise RuntimeError("the outer one fails")
    assert bodies(transport.receive("nested", 5)) == [b"outer"]
    transport.close()


@only("postgresql")
def test_a_killed_kept_connection_is_replaced_and_nothing_is_lost(database, postgres_admin):
    transport = database.transport()
    transport.create_queue("killed")
    transport.send_many("killed", [OutgoingMessage(b"one"), OutgoingMessage(b"two")])
    with transport.begin() as connection:
        pid = connection.connection.dbapi_connection.info.backend_pid
    with postgres_admin.connect() as admin:
        admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    with pytest.raises((exceptions.DatabaseError, sa.exc.DBAPIError)), transport.begin() as c:
        transport.receive("killed", connection=c)
    with transport.begin() as connection:
        assert connection.connection.dbapi_connection.info.backend_pid != pid
        assert bodies(transport.receive("killed", 5, connection=connection)) == [b"one", b"two"]
    transport.close()
    assert database.engine.pool.checkedout() == 0


@only("postgresql")
def test_a_forked_child_never_uses_the_connection_its_parent_keeps(database):
    transport = database.transport()
    transport.create_queue("forked")
    transport.send_many("forked", [OutgoingMessage(b"child"), OutgoingMessage(b"parent")])
    with transport.begin() as connection:
        pid = connection.connection.dbapi_connection.info.backend_pid
    child = os.fork()
    if child == 0:  # the child: its block runs on a connection of its own
        code = 1
        try:
            with transport.begin() as connection:
                own = connection.connection.dbapi_connection.info.backend_pid
                taken = transport.receive("forked", connection=connection)
            code = 0 if own != pid and bodies(taken) == [b"child"] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with transport.begin() as connection:  # the parent's kept connection works as before
        assert connection.connection.dbapi_connection.info.backend_pid == pid
        assert bodies(transport.receive("forked", connection=connection)) == [b"parent"]
    transport.close()


@only("sqlite")
def test_each_sqlite_block_takes_the_write_lock_when_it_begins_and_frees_it_when_it_ends(database):
    transport = database.transport()
    transport.create_queue("locks")
    transport.send_many("locks", [OutgoingMessage(b"%d" % number) for number in range(3)])
    got = []
    for _ in range(3):  # the first block begins the kept transaction, the others reuse it
        assert _sqlite_write_lock_is_free(database.url)
        with transport.begin() as connection:
            assert not _sqlite_write_lock_is_free(database.url)  # BEGIN IMMEDIATE, at once
            got.extend(transport.receive("locks", connection=connection))
    assert _sqlite_write_lock_is_free(database.url)
    assert bodies(got) == [b"0", b"1", b"2"]
    transport.close()


@only("postgresql")
def test_between_two_blocks_no_postgresql_transaction_is_open(database, postgres_admin):
    transport = database.transport()
    transport.create_queue("idle")
    transport.send_many("idle", [OutgoingMessage(b"%d" % number) for number in range(3)])
    seen = set()
    for _ in range(3):
        with transport.begin() as connection:
            pid = connection.connection.dbapi_connection.info.backend_pid
            seen.add(connection.execute(sa.text("SELECT txid_current()")).scalar_one())
            assert bodies(transport.receive("idle", connection=connection))
        with postgres_admin.connect() as admin:
            state = admin.execute(
                sa.text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()
        assert state == "idle"  # committed, not "idle in transaction"
    assert len(seen) == 3  # three transactions, one per block
    transport.close()


def test_a_session_bound_to_a_block_joins_it_and_never_commits_it(database):
    transport = database.transport()
    transport.create_queue("joined")
    _METADATA.create_all(database.engine)
    transport.send_many("joined", [OutgoingMessage(b"first"), OutgoingMessage(b"second")])
    with transport.begin() as connection:  # the kept transaction, begun by this block
        [first] = transport.receive("joined", connection=connection)
    for _ in range(2):  # on the kept transaction: the session's commit is not the block's
        with pytest.raises(RuntimeError), transport.begin() as connection:
            [message] = transport.receive("joined", connection=connection)
            with Session(bind=connection) as session:
                session.execute(_ORDERS.insert().values(body=message.body))
                session.commit()
            raise RuntimeError("the handler failed after its session committed")
    assert first.body == b"first"
    assert _orders(database.engine) == []
    assert bodies(transport.receive("joined", 5)) == [b"second"]
    transport.close()


def test_a_block_that_commits_by_itself_keeps_what_it_committed(database):
    transport = database.transport()
    transport.create_queue("own")
    _METADATA.create_all(database.engine)
    transport.send_many("own", [OutgoingMessage(b"%d" % number) for number in range(3)])
    with transport.begin() as connection:
        transport.receive("own", connection=connection)
    with transport.begin() as connection:
        [message] = transport.receive("own", connection=connection)
        connection.execute(_ORDERS.insert().values(body=message.body))
        connection.commit()  # SQLAlchemy's own: the block's transaction ends here
    with transport.begin() as connection:  # the next block commits as before
        [last] = transport.receive("own", connection=connection)
    assert (message.body, last.body) == (b"1", b"2")
    assert _orders(database.engine) == [b"1"]
    assert transport.receive("own", 5) == []
    transport.close()
    assert database.engine.pool.checkedout() == 0


def test_sqlalchemy_events_see_each_block_begin_and_end(database):
    transport = database.transport()
    transport.create_queue("events")
    transport.send_many("events", [OutgoingMessage(b"%d" % number) for number in range(3)])
    seen: list[str] = []
    for name in ("begin", "commit", "rollback"):
        sa.event.listen(database.engine, name, lambda _c, name=name: seen.append(name))
    for _ in range(2):
        with transport.begin() as connection:
            transport.receive("events", connection=connection)
    with pytest.raises(RuntimeError), transport.begin() as connection:
        transport.receive("events", connection=connection)
        raise RuntimeError("rolled back")
    with transport.begin() as connection:
        assert bodies(transport.receive("events", connection=connection)) == [b"2"]
    assert seen == ["begin", "commit", "begin", "commit", "begin", "rollback", "begin", "commit"]
    transport.close()
