"""``Transport.begin()``: ``engine.begin()``'s guarantee on a connection the thread keeps.

The block's work commits together when it ends, and rolls back together when it raises (a
receive's messages return to their places with the block's own writes undone). The thread
keeps the connection between blocks (no pool checkout per transaction), within the same budget
as the transport's own statements, never after a failure, and gives it back when the thread
ends or the transport closes. A nested block is a transaction of its own, as with
``engine.begin()``.
"""

from __future__ import annotations

import gc
import os
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqlqueue_orm import OutgoingMessage, Transport, db, exceptions
from tests.conftest import only
from tests.integration.support import bodies

_METADATA = sa.MetaData()
_ORDERS = sa.Table(
    "orders_seen",
    _METADATA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("body", sa.LargeBinary),
)


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
