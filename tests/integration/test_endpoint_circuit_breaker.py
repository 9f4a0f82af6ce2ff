"""The database goes away under load: the pump backs off, raises a critical error, resumes alone.

The outage: the test database refuses new connections (``ALLOW_CONNECTIONS false``) and every
connection to it is terminated (``pg_terminate_backend``), for longer than
``critical_error_after``; then it comes back. In TRANSACTION_SCOPE the receive and the
handler's row commit together, so every message is handled exactly once across the outage.
"""

from __future__ import annotations

import sqlite3
import threading
import time

import sqlalchemy as sa

from sqlqueue_orm import Transport, db
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.conftest import only
from tests.endpoint_app import Handled, Job, UserBase, handled_ids, send_jobs
from tests.integration.test_endpoint_transaction_modes import run_until

COUNT = 300


def cut(admin: sa.Engine, name: str, allow: bool) -> None:
    with admin.connect() as connection:
        connection.exec_driver_sql(
            f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {str(allow).lower()}'
        )
        if not allow:
            connection.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )


def _quick_endpoint(transport: Transport, critical: list[str], max_backoff: float) -> Endpoint:
    """Endpoint "jobs" retrying within *max_backoff* s; its critical errors go to *critical*
    after 1 s of outage."""
    settings = EndpointSettings(
        concurrency=2,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1,
        critical_error_after=1.0,
        initial_backoff=0.05,
        max_backoff=max_backoff,
    )
    return Endpoint(
        "jobs",
        transport,
        settings=settings,
        on_critical_error=lambda description, error: critical.append(description),
    )


@only("postgresql")
def test_the_pump_survives_an_outage_and_handles_each_message_once(database, postgres_admin):
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    sent = send_jobs(transport, "jobs", COUNT)
    critical: list[str] = []
    endpoint = _quick_endpoint(transport, critical, max_backoff=0.5)
    name = str(database.engine.url.database)
    outage_done = threading.Event()

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id))
        time.sleep(0.005)
        if job.number == 50:  # a third of the way: take the database away for 2.5 s
            def outage() -> None:
                cut(postgres_admin, name, allow=False)
                time.sleep(2.5)
                cut(postgres_admin, name, allow=True)
                outage_done.set()

            threading.Thread(target=outage, daemon=True).start()

    try:
        run_until(
            endpoint,
            lambda: outage_done.is_set() and _handled_count(database.engine) >= COUNT,
            timeout=120,
        )
    finally:
        cut(postgres_admin, name, allow=True)
    _handled_count(database.engine)  # a pooled connection the outage killed goes first
    ids = handled_ids(database.engine)
    assert sorted(ids) == sorted(sent)  # none lost, none twice
    assert transport.peek("jobs") == 0
    assert any("Failed to" in description for description in critical)
    assert not endpoint._pump.peek_breaker.armed  # type: ignore[union-attr]


def _handled_count(engine: sa.Engine) -> int:
    """Rows in Handled; -1 when the test's own pooled connection died in the outage (it is
    dropped, and the next call connects anew)."""
    try:
        return len(handled_ids(engine))
    except sa.exc.OperationalError:
        return -1


class Outage:
    """The database refuses the endpoint's work until :meth:`end`, as each dialect can.

    PostgreSQL refuses new connections and terminates the open ones. SQLite cannot go away
    under an open file: another connection holds the write lock, so every receive and every
    move of delayed messages runs out of its busy timeout (the peek, a read, still works).
    """

    def __init__(self, database, request) -> None:  # type: ignore[no-untyped-def]
        self.database = database
        self.request = request
        self._lock: sqlite3.Connection | None = None

    def begin(self) -> None:
        if self.database.dialect == "sqlite":
            self._lock = sqlite3.connect(str(self.database.engine.url.database), timeout=30)
            self._lock.execute("BEGIN IMMEDIATE")
        else:
            admin = self.request.getfixturevalue("postgres_admin")
            cut(admin, str(self.database.engine.url.database), allow=False)

    def end(self) -> None:
        if self._lock is not None:
            self._lock.rollback()
            self._lock.close()
            self._lock = None
        elif self.database.dialect != "sqlite":
            admin = self.request.getfixturevalue("postgres_admin")
            cut(admin, str(self.database.engine.url.database), allow=True)


def test_each_outage_raises_the_critical_error_once(database, request):
    """Peek, receive and the delayed mover fail together in an outage: one critical error each."""
    engine = database.engine
    if database.dialect == "sqlite":  # each refused write gives up after 0.2 s
        engine = db.create_engine(f"{database.url}?timeout=0.2")
    transport = Transport(engine)
    UserBase.metadata.create_all(engine)
    transport.create_queue("jobs")
    sent = send_jobs(transport, "jobs", 40)
    critical: list[str] = []
    endpoint = _quick_endpoint(transport, critical, max_backoff=0.3)
    outage = Outage(database, request)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id))
        time.sleep(0.02)

    endpoint.start()
    try:
        wait_for(lambda: _handled_count(engine) >= 5)  # then away, with messages waiting
        outage.begin()
        time.sleep(4)
        outage.end()
        wait_for(lambda: _handled_count(engine) >= len(sent))
        assert len(critical) == 1, critical
        time.sleep(1)  # every breaker works again: the next outage is another one
        sent += send_jobs(database.transport(), "jobs", 40)  # its writes wait their turn
        wait_for(lambda: _handled_count(engine) >= len(sent) - 35)
        outage.begin()
        time.sleep(4)
        outage.end()
        wait_for(lambda: _handled_count(engine) >= len(sent))
    finally:
        outage.end()
        assert endpoint.stop(10)
    assert sorted(handled_ids(engine)) == sorted(sent)  # none lost, none twice
    assert len(critical) == 2, critical
    transport.close()


def wait_for(done, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
