"""The database goes away under load: the pump backs off, raises a critical error, resumes alone.

The outage: the test database refuses new connections (``ALLOW_CONNECTIONS false``) and every
connection to it is terminated (``pg_terminate_backend``), for longer than
``critical_error_after``; then it comes back. In TRANSACTION_SCOPE the receive and the
handler's row commit together, so every message is handled exactly once across the outage.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

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


@only("postgresql")
def test_the_pump_survives_an_outage_and_handles_each_message_once(database, postgres_admin):
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    transport.create_queue("jobs")
    sent = send_jobs(transport, "jobs", COUNT)
    critical: list[str] = []
    settings = EndpointSettings(
        concurrency=2,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1,
        critical_error_after=1.0,
        initial_backoff=0.05,
        max_backoff=0.5,
    )
    endpoint = Endpoint(
        "jobs",
        transport,
        settings=settings,
        on_critical_error=lambda description, error: critical.append(description),
    )
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
