"""Wake-up instead of polling: a send wakes an idle endpoint long before its 5 s peek delay.

In-process on every database (the sending Transport is the endpoint's); on PostgreSQL also
from any other writer, through the NOTIFY trigger. Latency figures are for benchmarks/, not
asserted here beyond "well under the peek delay".
"""

from __future__ import annotations

import threading
import time

from sqlqueue_orm import OutgoingMessage, Transport, db
from sqlqueue_orm.receiving import Endpoint, HandlerContext
from tests.conftest import only
from tests.endpoint_app import Job

PEEK_DELAY = 5.0


def idle_endpoint(transport: Transport, **settings: object) -> tuple[Endpoint, threading.Event]:
    handled = threading.Event()
    endpoint = Endpoint("idle", transport, peek_delay=PEEK_DELAY, **settings)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        handled.set()

    endpoint.start()
    time.sleep(0.5)  # the first peek found nothing: the pump sleeps its peek delay
    return endpoint, handled


def test_a_send_of_this_process_wakes_its_endpoint(database):
    transport = database.transport()
    endpoint, handled = idle_endpoint(transport, notify=False)
    try:
        began = time.monotonic()
        transport.send("idle", OutgoingMessage(Job(number=1)))
        assert handled.wait(PEEK_DELAY - 1), "not woken"
        assert time.monotonic() - began < 1.0
    finally:
        endpoint.stop()


def test_a_handlers_send_wakes_the_endpoint_of_its_destination_after_the_commit(database):
    transport = database.transport()
    endpoint, handled = idle_endpoint(transport, notify=False)
    relay = Endpoint("relay", transport, peek_delay=PEEK_DELAY, notify=False)
    relay.handle(Job, lambda job, context: context.send("idle", job))
    relay.start()
    try:
        time.sleep(0.5)
        began = time.monotonic()
        relay.send("relay", Job(number=2))
        assert handled.wait(PEEK_DELAY - 1), "not woken"
        assert time.monotonic() - began < 1.5
    finally:
        relay.stop()
        endpoint.stop()


@only("postgresql")
def test_notify_wakes_the_endpoint_for_a_send_by_another_writer(database):
    endpoint, handled = idle_endpoint(database.transport(), notify=True)
    other_engine = db.create_engine(database.url)
    try:
        assert endpoint._pump._listener.listening.wait(5)  # type: ignore[union-attr]
        other = Transport(other_engine)  # not the endpoint's transport: no in-process hook
        began = time.monotonic()
        other.send("idle", OutgoingMessage(Job(number=3)))
        assert handled.wait(PEEK_DELAY - 1), "not woken"
        assert time.monotonic() - began < 1.0
    finally:
        endpoint.stop()
        other_engine.dispose()
