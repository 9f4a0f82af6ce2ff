"""Wake-up instead of polling: a send wakes an idle endpoint long before its 5 s peek delay.

In-process on every database (the sending Transport is the endpoint's); on PostgreSQL also
from any other writer, through the NOTIFY trigger, another process included. Latency figures
are for benchmarks/, not asserted here beyond "well under the peek delay". And a handler
running long does not make the pump spin peeks and receives meanwhile.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

from sqlqueue_orm import OutgoingMessage, Transport, db
from sqlqueue_orm.receiving import Endpoint, HandlerContext
from tests.conftest import only
from tests.endpoint_app import Job
from tests.integration import workers

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


@only("postgresql")
def test_notify_wakes_the_endpoint_for_each_send_of_another_process(database):
    """Another process sends 10 messages 0.1 s apart; each is handled well before the 10 s
    peek delay (the first peek found nothing: only the NOTIFY wake-ups can explain it)."""
    delays: list[float] = []
    endpoint = Endpoint("remote", database.transport(), peek_delay=10.0, notify=True)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        delays.append(time.time() - float(body))

    endpoint.start()
    try:
        assert endpoint._pump._listener.listening.wait(5)  # type: ignore[union-attr]
        time.sleep(0.3)  # the first peek is behind us
        sender = multiprocessing.get_context("spawn").Process(
            target=workers.send_stamped, args=(database.url, "remote", 10, 0.1)
        )
        sender.start()
        sender.join(60)
        assert sender.exitcode == 0
        deadline = time.monotonic() + 5
        while len(delays) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(delays) == 10, delays
        assert max(delays) < 2.0, delays  # the peek delay is 10 s
        assert endpoint.stats.handled == 10
    finally:
        endpoint.stop()


def test_a_long_handler_does_not_make_the_pump_spin(database):
    """While the one message of the queue is handled for 1 s, the pump does not peek and receive
    in a loop: PostgreSQL's peek still counts the row until its receive commits, and the pump
    used to peek again at once after each receive that found nothing (about 1,700 times)."""
    transport = database.transport()
    running = threading.Event()
    endpoint = Endpoint("slow", transport, peek_delay=1.0, concurrency=2, notify=False)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        running.set()
        time.sleep(1.0)

    endpoint.start()
    try:
        transport.send("slow", OutgoingMessage(Job(number=4)))
        assert running.wait(5), "not handled"
        before = endpoint.stats.peeks
        time.sleep(0.9)
        during = endpoint.stats.peeks - before
        assert during <= 40, f"{during} peeks while one handler ran for 0.9 s"
    finally:
        endpoint.stop()
    assert endpoint.stats.handled == 1


def test_a_message_sent_while_a_long_handler_runs_is_handled_at_once(database):
    """The pump skips the rows its own handlers hold, but not a message behind them.

    SQLite has one writer: the second receive waits for the first handler's commit."""
    transport = database.transport()
    started: dict[int, float] = {}
    endpoint = Endpoint("behind", transport, peek_delay=PEEK_DELAY, concurrency=2, notify=False)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        started[job.number] = time.monotonic()
        if job.number == 1:
            time.sleep(1.5)

    endpoint.start()
    try:
        transport.send("behind", OutgoingMessage(Job(number=1)))
        deadline = time.monotonic() + 5
        while 1 not in started and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the pump has peeked and sleeps: only its own handler's row is there
        began = time.monotonic()
        transport.send("behind", OutgoingMessage(Job(number=2)))
        while 2 not in started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 2 in started, "not handled"
        if database.dialect == "sqlite":
            assert started[2] - began < 2.0  # right after the first commits
        else:
            assert started[2] - began < 1.0  # while the first handler still runs
    finally:
        endpoint.stop()


def test_a_retried_message_is_taken_again_at_once_not_after_the_peek_delay(database):
    """A handler failing once rolls its receive back: the row returns and the handler's end
    wakes the pump, which was sleeping because the peek counted only that row."""
    transport = database.transport()
    attempts: list[float] = []
    endpoint = Endpoint("again", transport, peek_delay=PEEK_DELAY, concurrency=2, notify=False)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            time.sleep(0.5)  # long enough for the pump to peek and go to sleep
            raise RuntimeError("once")

    endpoint.start()
    try:
        transport.send("again", OutgoingMessage(Job(number=5)))
        deadline = time.monotonic() + PEEK_DELAY - 1
        while endpoint.stats.handled < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert endpoint.stats.handled == 1 and endpoint.stats.retried == 1, endpoint.stats
        assert attempts[1] - attempts[0] < 2.0
    finally:
        endpoint.stop()
