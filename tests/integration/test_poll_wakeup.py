"""Poll-only wake-up (``wakeup="poll"``), for connections through PgBouncer's transaction pooling.

No ``LISTEN`` there, so a pump that found messages keeps peeking every ``burst_delay`` while
they keep coming: messages sent one by one by another process (no in-process wake-up) are each
picked up long before the 5 s peek delay, and once the burst window passes idle, the queue is
peeked only every peek delay again. Bounds are "well under the peek delay", not speed figures.
"""

from __future__ import annotations

import threading
import time

from sqlqueue_orm import OutgoingMessage, Transport, db
from sqlqueue_orm.receiving import Endpoint, HandlerContext
from tests.conftest import Database
from tests.endpoint_app import Job

PEEK_DELAY = 5.0
BURST_WINDOW = 1.5


def test_a_burst_is_picked_up_without_waiting_the_peek_delay_then_polling_slows(
    database: Database,
) -> None:
    transport = database.transport()
    transport.create_queue("burst")
    other_engine = db.create_engine(database.url)
    other = Transport(other_engine)  # another writer: its sends wake nobody in this process
    handled: dict[int, float] = {}
    arrived = threading.Condition()
    endpoint = Endpoint(
        "burst", transport, peek_delay=PEEK_DELAY, wakeup="poll", burst_delay=0.02,
        burst_window=BURST_WINDOW,
    )

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        with arrived:
            handled[job.number] = time.monotonic()
            arrived.notify_all()

    def wait_for(number: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: number in handled, PEEK_DELAY * 2), number

    other.send("burst", OutgoingMessage(Job(number=0)))  # the first peek finds it: a burst
    endpoint.start()
    try:
        wait_for(0)
        latencies = []
        for number in range(1, 6):
            time.sleep(0.2)
            sent = time.monotonic()
            other.send("burst", OutgoingMessage(Job(number=number)))
            wait_for(number)
            latencies.append(handled[number] - sent)
        assert max(latencies) < PEEK_DELAY / 2, latencies
        # Idle past the window: back to one peek per peek delay.
        time.sleep(BURST_WINDOW + 0.5)
        before = endpoint.stats.peeks
        time.sleep(2.0)
        assert endpoint.stats.peeks - before <= 1
    finally:
        endpoint.stop()
        other_engine.dispose()
