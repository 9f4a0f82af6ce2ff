"""In flight: the messages an endpoint's handlers hold now, never a receive that finds nothing.

The heartbeat (``sqlqueue endpoints``, the dashboard's Endpoints page) and the ``run`` status
line show it; ``received`` counts the messages taken, those in flight among them, so it is at
least handled, failed and in flight together.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from sqlqueue_orm import health
from sqlqueue_orm.cli import run
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode
from tests.endpoint_app import Job, send_jobs
from tests.health_app import BEAT
from tests.integration.test_endpoint_health import eventually


def test_an_idle_endpoint_has_nothing_in_flight_while_its_receives_find_nothing(database):
    """A receive that found nothing counted as in flight while it ran: an idle instance whose
    last beat was written during one (the first beat, at start, meets the receive that
    confirms the queue empty) showed "in flight 1/1" though it never received a message."""
    transport = database.transport()
    transport.create_queue("idle")
    endpoint = Endpoint("idle", transport, peek_delay=0.1, concurrency=1,
                        heartbeat_interval=BEAT)
    release = threading.Event()

    def handle(job: Job, context: HandlerContext) -> None:
        release.wait(30)

    endpoint.handle(Job, handle)
    seen: list[int] = []  # in flight as each statement of a worker runs

    def record(*_args: object) -> None:
        if " worker " in threading.current_thread().name:
            seen.append(endpoint.stats.in_flight)

    sa.event.listen(transport.engine, "before_cursor_execute", record)
    endpoint.start()
    try:
        pump = endpoint._pump
        assert pump is not None
        assert pump.drained.wait(30)  # a receive found the queue empty
        assert seen and set(seen) == {0}, seen
        [idle] = eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: len(found) == 1 and found[0].last_seen > time.time() - BEAT,
            "a beat while idle",
        )
        assert idle.in_flight == 0
        # a message being handled is in flight, and no longer once handled
        send_jobs(transport, "idle", 1)
        eventually(lambda: endpoint.stats.in_flight, lambda count: count == 1, "in flight")
        release.set()
        eventually(lambda: endpoint.stats.handled, lambda count: count == 1, "handled")
        assert endpoint.stats.in_flight == 0
    finally:
        release.set()
        assert endpoint.stop(10)
    [stopped] = health.read_endpoints(database.engine)
    assert (stopped.state, stopped.in_flight, stopped.processed) == (health.STOPPED, 0, 1)


def test_the_run_status_line_receives_what_is_handled_and_what_is_in_flight(database):
    """The status line read "received 28, handled 28, in flight 2": received counted only
    the messages done with, in flight the receives running. Two handled and two held: four
    received."""
    transport = database.transport()
    transport.create_queue("status")
    # NONE commits each receive before its handler: two held at once on SQLite too
    endpoint = Endpoint(
        "status", transport, peek_delay=0.1, concurrency=2, transaction_mode=TransactionMode.NONE
    )
    release = threading.Event()

    def handle(job: Job, context: HandlerContext) -> None:
        if job.number >= 2:
            release.wait(30)

    endpoint.handle(Job, handle)
    send_jobs(transport, "status", 4)
    endpoint.start()
    try:
        eventually(
            lambda: (endpoint.stats.handled, endpoint.stats.in_flight),
            lambda counts: counts == (2, 2),
            "two handled, two held",
        )
        line = run._status(run._totals(endpoint))
        assert line.startswith("received 4, handled 2, failed 0, in flight 2, "), line
        release.set()
        eventually(lambda: endpoint.stats.handled, lambda count: count == 4, "all handled")
        line = run._status(run._totals(endpoint))
        assert line.startswith("received 4, handled 4, failed 0, in flight 0, "), line
    finally:
        release.set()
        assert endpoint.stop(10)
