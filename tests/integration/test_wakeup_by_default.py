"""Wake-up by default: another process's send wakes an idle endpoint, paid only while one waits.

With the default settings an INSERT by any other connection (a .NET endpoint's, say) wakes an
endpoint whose peek delay is 30 s: on PostgreSQL through the conditional NOTIFY trigger, on
SQLite through ``PRAGMA data_version``. On PostgreSQL the trigger notifies only while an endpoint
of the queue is registered as waiting: not while a backlog is worked, and not after the waiting
process was killed. Behind PgBouncer in transaction mode the default detects the pooler and
polls. The bounds are "long before the peek delay", not speed figures (those are benchmarks).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, Transport, db, dialects, exceptions
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.receiving import Endpoint, HandlerContext, pump, wakeup
from tests.conftest import Database, only
from tests.endpoint_app import Job
from tests.integration.support import waited

PEEK_DELAY = 30.0


def raw_insert(url: str, queue: str) -> None:
    """One row INSERTed as the .NET transports do: not through a Transport (no hook)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        table = queue_table(queue, None, engine.dialect)
        message_id = uuid.uuid4()
        values: dict[str, Any] = {
            "Id": message_id,
            "Headers": json.dumps({"NServiceBus.MessageId": str(message_id)}),
            "Body": b"raw",
        }
        if "Recoverable" in table.c:
            values["Recoverable"] = True
        with engine.begin() as connection:
            connection.execute(sa.insert(table).values(values))
    finally:
        engine.dispose()


def test_a_raw_insert_by_another_connection_wakes_an_idle_endpoint(database: Database) -> None:
    transport = database.transport()
    transport.create_queue("idle")
    handled = threading.Event()
    endpoint = Endpoint("idle", transport, peek_delay=PEEK_DELAY)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        handled.set()

    endpoint.start()
    try:
        assert endpoint._pump is not None
        assert endpoint._pump.drained.wait(10)  # idle: asleep for its 30 s peek delay
        time.sleep(0.2)
        raw_insert(database.url, "idle")
        assert handled.wait(PEEK_DELAY / 3), "not woken: the peek delay would have found it"
    finally:
        endpoint.stop()


def test_a_wake_for_a_message_taken_already_leaves_the_endpoint_listening(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notification can come after the pump's own peek took its message (it registered, peeked
    once more and found it). The receive the wake starts finds nothing; the pump then peeks and
    waits as idle, so the next send by another connection still wakes it, instead of pausing
    deaf to it for the empty-receive pause (30 s here, as long as the peek delay)."""
    monkeypatch.setattr(pump, "EMPTY_RECEIVE_PAUSE", PEEK_DELAY)
    transport = database.transport()
    transport.create_queue("late")
    handled = threading.Event()
    endpoint = Endpoint("late", transport, peek_delay=PEEK_DELAY)
    endpoint.handle_raw(lambda body, context: handled.set())
    endpoint.start()
    try:
        assert endpoint._pump is not None
        assert endpoint._pump.drained.wait(10)
        time.sleep(0.2)  # idle, waiting
        peeks = endpoint.stats.peeks
        endpoint._pump.wake()  # a notification whose message is gone already
        # the empty receive, then (once mended) a peek: waiting again
        waited(lambda: endpoint.stats.peeks > peeks, 2.0)
        time.sleep(0.2)
        raw_insert(database.url, "late")
        assert handled.wait(PEEK_DELAY / 3), "deaf after the empty receive: not woken"
    finally:
        endpoint.stop()


# -- PostgreSQL: who pays for the NOTIFY --------------------------------------------------------
class Notifications:
    """A connection of the test's own LISTENing on the wake-up channel, counting."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.raw = self.engine.raw_connection()
        self.driver: Any = self.raw.driver_connection
        self.driver.autocommit = True
        statements = dialects.for_dialect(self.engine).notify_wakeup
        assert statements is not None
        self.driver.execute(statements.listen)

    def count(self, seconds: float = 0.3) -> int:
        return sum(1 for _ in self.driver.notifies(timeout=seconds))

    def close(self) -> None:
        self.raw.close()
        self.engine.dispose()


@pytest.fixture
def notifications(database: Database) -> Iterator[Notifications]:
    listening = Notifications(database.url)
    yield listening
    listening.close()


def waiters(engine: sa.Engine, queue: str) -> int:
    """Endpoints registered as waiting on *queue* (their session locks, on the server)."""
    statements = dialects.for_dialect(engine).notify_wakeup
    assert statements is not None
    with engine.connect() as connection:
        key = wakeup.queue_key(connection, Transport(engine).queues.address(queue))
        return int(
            connection.execute(
                sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted "
                    "AND classid::bigint = ANY(:slots) AND objid::bigint = :key"
                ),
                {"slots": list(statements.slot_keys()), "key": key % 2**32},
            ).scalar_one()
        )


@only("postgresql")
def test_sends_notify_only_while_an_endpoint_waits(database, notifications):
    """A backlog is worked while another writer keeps sending: no notification at all. Once
    the endpoint is idle (registered as waiting), the next send notifies, and wakes it."""
    transport = database.transport()
    transport.create_queue("loaded")
    other_engine = db.create_engine(database.url)
    other = Transport(other_engine)
    backlog = 200
    for number in range(backlog):
        other.send("loaded", OutgoingMessage(Job(number=number)))
    # no delayed-message mover: its INSERT ... SELECT fires the statement trigger, rows or not
    endpoint = Endpoint(
        "loaded", transport, peek_delay=PEEK_DELAY, concurrency=1, delayed_delivery=False
    )

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        time.sleep(0.002)

    endpoint.start()
    try:
        sent = 0
        while endpoint.stats.handled < backlog // 2:  # the backlog is not drained yet
            other.send("loaded", OutgoingMessage(Job(number=backlog + sent)))
            sent += 1
            time.sleep(0.005)
        assert sent >= 10, sent
        assert notifications.count() == 0
        assert waited(lambda: endpoint.stats.handled == backlog + sent, 30)
        assert waited(lambda: waiters(database.engine, "loaded") == 1, 10.0)
        assert notifications.count(0.1) == 0  # idle, nothing sent: nothing notified
        other.send("loaded", OutgoingMessage(Job(number=-1)))
        assert notifications.count(2.0) == 1
        assert waited(lambda: endpoint.stats.handled == backlog + sent + 1, PEEK_DELAY / 3)
    finally:
        endpoint.stop()
        other_engine.dispose()


ENDPOINT_PROCESS = """
import sys, time
from sqlqueue_orm import Transport, db
from sqlqueue_orm.receiving import Endpoint
transport = Transport(db.create_engine(sys.argv[1]))
endpoint = Endpoint("killed", transport, peek_delay=30.0, delayed_delivery=False)
endpoint.handle_raw(lambda body, context: print("handled", flush=True))
endpoint.start()
print("started", flush=True)
time.sleep(600)
"""


@only("postgresql")
def test_a_killed_waiting_endpoint_leaves_no_send_notifying(database, notifications):
    """An endpoint process registered as waiting is SIGKILLed: its session, and with it the
    registration, ends; the sends after it notify nobody."""
    transport = database.transport()
    transport.create_queue("killed")
    process = subprocess.Popen(
        [sys.executable, "-c", ENDPOINT_PROCESS, database.url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert waited(lambda: waiters(database.engine, "killed") == 1, 30)
        transport.send("killed", OutgoingMessage(Job(number=1)))
        assert notifications.count(2.0) == 1  # it waits, so the send notified
        assert process.stdout is not None
        while process.stdout.readline().strip() != "handled":
            pass
        assert waited(lambda: waiters(database.engine, "killed") == 1, 30)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        assert waited(lambda: waiters(database.engine, "killed") == 0, 10.0)
        for number in range(3):
            transport.send("killed", OutgoingMessage(Job(number=number)))
        assert notifications.count(0.5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@only("postgresql")
def test_behind_pgbouncer_in_transaction_mode_the_default_polls_and_handles_every_message(
    database, caplog
):
    """The default detects the pooler: no LISTEN, no registration left on a pooled server
    connection, one log line naming the queue; every message is handled once."""
    from tests.pooler import transaction_pooler

    with transaction_pooler(database.url) as pooled_url:
        pooled = sa.create_engine(pooled_url, connect_args={"prepare_threshold": None})
        try:
            transport = Transport(pooled)
            transport.create_queue("pooled")
            with pytest.raises(exceptions.ConfigurationError, match="pooler in transaction mode"):
                Endpoint("pooled", transport, notify=True).start()
            handled: list[int] = []
            endpoint = Endpoint("pooled", transport, peek_delay=0.5)

            @endpoint.handle(Job)
            def handle(job: Job, context: HandlerContext) -> None:
                handled.append(job.number)

            with caplog.at_level("INFO", logger="sqlqueue_orm.receiving.waiting"):
                endpoint.start()
            try:
                assert any(
                    "pooler" in record.getMessage() and "pooled" in record.getMessage()
                    for record in caplog.records
                )
                sender = Transport(pooled)  # not the endpoint's: no in-process wake-up
                for number in range(30):
                    sender.send("pooled", OutgoingMessage(Job(number=number)))
                    time.sleep(0.01)
                assert waited(lambda: len(handled) >= 30, 60), len(handled)
                time.sleep(0.3)
                assert sorted(handled) == list(range(30))
                assert waiters(database.engine, "pooled") == 0
            finally:
                endpoint.stop()
        finally:
            pooled.dispose()


OLD_TRIGGER = (  # what notify=True installed before: a NOTIFY for every sending statement
    "CREATE TRIGGER sqlqueue_wakeup AFTER INSERT ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION sqlqueue_wakeup_notify()"
)


def trigger_definition(engine: sa.Engine, queue: str) -> tuple[str, str] | None:
    statements = dialects.for_dialect(engine).notify_wakeup
    assert statements is not None
    quoted = engine.dialect.identifier_preparer.quote(queue)
    with engine.connect() as connection:
        row = connection.execute(
            sa.text(statements.trigger_catalog),
            {"table": quoted, "trigger": statements.trigger},
        ).first()
    return None if row is None else (str(row[0]), str(row[1]))


@only("postgresql")
def test_the_old_trigger_is_replaced_and_a_current_one_is_left_alone(database, notifications):
    """The unconditional trigger of ``notify=True`` is replaced at start; a start that finds
    the current trigger does not touch it, so it does not queue behind a transaction holding
    the table (CREATE and DROP TRIGGER would wait for it)."""
    transport = database.transport()
    transport.create_queue("upgraded")
    quoted = database.engine.dialect.identifier_preparer.quote("upgraded")
    statements = dialects.for_dialect(database.engine).notify_wakeup
    with database.engine.begin() as connection:
        connection.exec_driver_sql(statements.create_function)
        connection.exec_driver_sql(OLD_TRIGGER.format(table=quoted))
    transport.send("upgraded", OutgoingMessage(Job(number=0)))
    assert notifications.count(1.0) == 1  # the old trigger: nobody waits, yet it notifies
    first = Endpoint("upgraded", transport, peek_delay=PEEK_DELAY, delayed_delivery=False)
    first.handle(Job, lambda job, context: None)
    first.start()
    first.stop()
    current = trigger_definition(database.engine, "upgraded")
    assert current is not None and "pg_try_advisory_xact_lock_shared" in current[0]
    notifications.count(0.2)
    transport.send("upgraded", OutgoingMessage(Job(number=1)))
    assert notifications.count(0.5) == 0  # nobody waits: no NOTIFY
    with database.engine.connect() as holder:  # a long transaction writing to the queue
        holder.begin()
        holder.exec_driver_sql(f"LOCK TABLE {quoted} IN ROW EXCLUSIVE MODE")
        second = Endpoint(  # (creating the queue's indexes would wait for it too)
            "upgraded",
            transport,
            peek_delay=PEEK_DELAY,
            delayed_delivery=False,
            create_queues=False,
        )
        second.handle(Job, lambda job, context: None)
        starting = threading.Thread(target=second.start, daemon=True)
        starting.start()
        starting.join(15)
        started = not starting.is_alive()
        holder.rollback()
    starting.join(15)
    second.stop()
    assert started, "the start waited for the transaction holding the table"
    assert trigger_definition(database.engine, "upgraded") == current


@only("postgresql")
def test_a_role_that_may_not_create_the_trigger_warns_once_and_polls(database, caplog):
    """Not the table's owner: one warning naming the queue; the endpoint still handles what
    is sent (in-process wake-ups and polling)."""
    transport = database.transport()
    transport.create_queue("owned")
    role = f"sender_{uuid.uuid4().hex[:8]}"
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD 'x'")
        connection.exec_driver_sql(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        connection.exec_driver_sql(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    url = sa.make_url(database.url).set(username=role, password="x")
    engine = db.create_engine(url.render_as_string(hide_password=False))
    try:
        limited = Transport(engine)
        required = Endpoint("owned", limited, notify=True, create_queues=False)
        with pytest.raises(exceptions.ConfigurationError, match="may not create"):
            required.start()
        handled = threading.Event()
        endpoint = Endpoint(
            "owned", limited, peek_delay=0.5, create_queues=False, delayed_delivery=False
        )
        endpoint.handle(Job, lambda job, context: handled.set())
        with caplog.at_level("WARNING"):
            endpoint.start()
        try:
            warnings = [r.getMessage() for r in caplog.records if "trigger" in r.getMessage()]
            assert len(warnings) == 1 and "owned" in warnings[0], warnings
            assert trigger_definition(database.engine, "owned") is None
            limited.send("owned", OutgoingMessage(Job(number=1)))
            assert handled.wait(10)
        finally:
            endpoint.stop()
    finally:
        engine.dispose()
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"DROP OWNED BY {role}")
            connection.exec_driver_sql(f"DROP ROLE {role}")


@only("sqlite")
def test_an_idle_sqlite_endpoint_holds_no_read_transaction(database):
    """The commit watcher reads ``PRAGMA data_version`` and nothing else: an idle endpoint does
    not pin the WAL, so a checkpoint can copy all of it back and truncate it."""
    transport = database.transport()
    transport.create_queue("watched")
    endpoint = Endpoint("watched", transport, peek_delay=PEEK_DELAY, delayed_delivery=False)
    endpoint.handle_raw(lambda body, context: None)
    endpoint.start()
    try:
        assert endpoint._pump is not None and endpoint._pump.drained.wait(10)
        time.sleep(0.2)  # asleep, the watcher reading every few ms
        checkpointer = sqlite3.connect(sa.make_url(database.url).database, isolation_level=None)
        try:
            busy, _, _ = checkpointer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            checkpointer.close()
        assert busy == 0
    finally:
        endpoint.stop()


@only("sqlite")
def test_sqlqueue_run_takes_a_wakeup_mode_and_names_a_bad_one(database):
    from tests.endpoint_app import send_jobs
    from tests.integration.cli_process import sqlqueue
    from testsupport.outbox_app import REPO

    endpoint = ["--url", database.url, "run", "tests.endpoint_app:endpoint"]
    bad = sqlqueue(*endpoint, "--wakeup", "sometimes", cwd=REPO)
    assert bad.returncode == 2
    [line] = bad.stderr.splitlines()
    assert "'sometimes' is not one of auto, required, poll, off" in line, line
    transport = database.transport()
    transport.create_queue("jobs")
    send_jobs(transport, "jobs", 5)
    done = sqlqueue(*endpoint, "--wakeup", "off", "--once", cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "handled 5" in done.stdout
