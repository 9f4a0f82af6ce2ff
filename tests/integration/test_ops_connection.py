"""An endpoint's operations threads (control poller, health writer) keep one connection.

A running endpoint reads its control row twice a second and beats every few seconds. Those
reads and writes must not go through the engine's pool each time (a checkout, a ROLLBACK, and,
when the pump's workers hold the idle connections, a fresh server connection per poll): both
threads share one connection of their own, opened once and kept. Proved here on the real
database: after the first beat, neither thread checks a connection out of the pool again, and on
PostgreSQL no new server backend appears while they poll and beat; the poller still applies a
pause made meanwhile, a connection that failed is replaced by the next poll, and a statement
of the other thread that holds the connection does not hold up the control read.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from sqlqueue_orm import control
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode
from tests.integration.support import wait_until

TIMEOUT = 20.0


def backends(engine: sa.Engine) -> set[tuple[int, object]]:
    """Server processes connected to the test's database now: (pid, backend start)."""
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT pid, backend_start FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).all()
    return {(row[0], row[1]) for row in rows}


def test_poller_and_health_writer_share_one_kept_connection(database):
    transport = database.transport()
    transport.create_queue("ops")
    transport.create_queue("error")
    control.create_tables(transport.engine, log_too=False)
    endpoint = Endpoint(
        "ops",
        transport,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        concurrency=4,
        create_queues=False,
        delayed_delivery=False,
        heartbeat_interval=0.2,
        metrics_interval=0.2,
    )

    def handle(body: bytes, context: HandlerContext) -> None:
        pass

    endpoint.handle_raw(handle)
    checkouts: dict[str, int] = {}
    lock = threading.Lock()

    def counted(*args: object) -> None:
        with lock:
            name = threading.current_thread().name
            checkouts[name] = checkouts.get(name, 0) + 1

    # a separate engine watches the server: its own connection is not among the endpoint's
    watcher = sa.create_engine(database.url) if database.dialect == "postgresql" else None
    endpoint.start()
    try:
        poller = endpoint._control
        assert poller is not None
        wait_until(lambda: poller.ops.opened == 1, "the first poll or beat", TIMEOUT)
        time.sleep(0.6)  # the health writer's first beats and samples: tables, first row
        sa.event.listen(transport.engine.pool, "checkout", counted)
        before = backends(watcher) if watcher is not None else set()
        time.sleep(2.2)  # four polls and ten beats with two samples each
        after = backends(watcher) if watcher is not None else set()
        sa.event.remove(transport.engine.pool, "checkout", counted)
        # the pump's own threads may check out; the operations threads never do
        assert "ops control" not in checkouts, checkouts
        assert "ops health" not in checkouts, checkouts
        assert after - before == set(), "a poll or a beat opened a server connection"
        assert poller.ops.opened == 1
        control.pause(transport, "ops")
        wait_until(lambda: poller.paused, "the poller applying the pause", TIMEOUT)

        # a connection that failed is dropped, and the next poll connects anew
        poller.ops._held.connection.invalidate()
        poller.poll()  # fails on the dead connection: the state is kept
        assert poller.paused
        control.resume(transport, "ops")
        wait_until(lambda: not poller.paused, "the poller applying the resume", TIMEOUT)
        assert poller.ops.opened == 2

        # a beat holding the kept connection (SQLite: waiting for the write lock) does not hold
        # up the control read: it reads through the pool meanwhile
        with poller.ops._lock:
            control.pause(transport, "ops")
            wait_until(
                lambda: poller.paused, "a pause applied while the connection is busy", TIMEOUT
            )
    finally:
        endpoint.stop()
        if watcher is not None:
            watcher.dispose()
