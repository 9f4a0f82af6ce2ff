"""A silent network partition between an endpoint and PostgreSQL: seconds of stall, not minutes.

The endpoint reaches the database through :class:`tests.relay.Relay`, which the test cuts
silently (nothing answers, nothing is reset) and heals. During the cut the endpoint must say
within seconds that the database does not answer, naming it, and raise its critical error after
``critical_error_after``; after the heal it must handle again within seconds, under load and
idle; and across the cut every message is handled exactly once. The sender writes straight to
the database, past the relay, so messages keep arriving during the cut.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, Transport, db
from sqlqueue_orm.aio import AsyncEndpoint, AsyncHandlerContext
from sqlqueue_orm.receiving import (
    Endpoint,
    EndpointSettings,
    HandlerContext,
    TransactionMode,
    unanswered,
)
from tests.conftest import only
from tests.endpoint_app import Handled, Job, UserBase, handled_ids
from tests.relay import Relay

#: Seconds of the cut under load, and idle.
CUT = 30.0
IDLE_CUT = 15.0
#: The bounds promised: a warning within 10 s of the cut; handling again within 10 s of the
#: heal under load, within 5 s for a message sent right after it to an idle endpoint.
WARNED_WITHIN = 10.0
HANDLES_AGAIN_UNDER_LOAD = 10.0
HANDLES_AGAIN_IDLE = 5.0
#: The load test's critical_error_after.
CRITICAL_AFTER = 8.0


class Lines(logging.Handler):
    """The package's log lines of WARNING and above, with the monotonic time of each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))

    def first(self, text: str, after: float) -> float | None:
        return next((at for at, line in self.lines if at >= after and text in line), None)


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("sqlqueue_orm")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def relayed(database) -> Iterator[tuple[Relay, sa.Engine]]:  # type: ignore[no-untyped-def]
    """A relay in front of the test database, and an engine connecting through it."""
    url = sa.make_url(database.url)
    with Relay(url.host or "127.0.0.1", url.port or 5432) as relay:
        engine = db.create_engine(url.set(host="127.0.0.1", port=relay.port), pool_size=8)
        try:
            yield relay, engine
        finally:
            relay.heal()
            engine.dispose()


def described(relay: Relay, database) -> str:  # type: ignore[no-untyped-def]
    """How the log names the database behind the relay: its address and name."""
    return f"127.0.0.1:{relay.port}/{sa.make_url(database.url).database}"


@pytest.mark.slow
@only("postgresql")
def test_a_cut_under_load_is_reported_and_handling_resumes_soon_after_the_heal(
    database, relayed, lines
):
    relay, engine = relayed
    UserBase.metadata.create_all(database.engine)
    direct = database.transport()
    direct.create_queue("jobs")
    critical: list[float] = []
    handled_at: list[float] = []
    endpoint = Endpoint(
        "jobs",
        Transport(engine),
        settings=EndpointSettings(
            concurrency=2,
            transaction_mode=TransactionMode.TRANSACTION_SCOPE,
            critical_error_after=CRITICAL_AFTER,
        ),
        on_critical_error=lambda description, error: critical.append(time.monotonic()),
    )

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id))
        handled_at.append(time.monotonic())

    sent: list[str] = []
    sending = threading.Event()
    sending.set()

    def sender() -> None:  # about 20 messages a second, straight to the database
        number = 0
        while sending.is_set():
            number += 1
            sent.append(direct.send("jobs", OutgoingMessage(Job(number=number))))
            time.sleep(0.05)

    thread = threading.Thread(target=sender, daemon=True)
    endpoint.start()
    try:
        thread.start()
        time.sleep(3)
        assert handled_at, "nothing handled before the cut"
        relay.cut()
        cut_at = time.monotonic()
        time.sleep(CUT)
        relay.heal()
        healed_at = time.monotonic()
        deadline = healed_at + 60
        while not [at for at in handled_at if at > healed_at] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)
        sending.clear()
        thread.join(10)
        deadline = time.monotonic() + 90
        while len(handled_ids(database.engine)) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"\nbacklog of {len(sent)} handled {time.monotonic() - healed_at:.1f} s after "
              "the heal")
    finally:
        sending.clear()
        relay.heal()
        assert endpoint.stop(15)

    warned = lines.first("does not answer", cut_at)
    again = min(at for at in handled_at if at > healed_at) - healed_at
    print(f"\nunder load: critical error {[round(at - cut_at, 1) for at in critical]} s into the "
          f"cut; warned {None if warned is None else round(warned - cut_at, 1)} s "
          f"into the cut, handled again {again:.1f} s after the heal")
    assert warned is not None, f"nothing said during the cut: {lines.lines}"
    assert warned - cut_at < WARNED_WITHIN
    assert described(relay, database) in next(
        line for at, line in lines.lines if at == warned
    )
    # As documented: once failures (no earlier than the cut, and by the time the connections
    # are dropped) have lasted critical_error_after, at the next failure: at most a connection
    # attempt (connect_timeout, 5 s) and a back-off (max_backoff, 2 s) later.
    assert critical, "no critical error in the cut"
    assert cut_at + CRITICAL_AFTER <= critical[0] < warned + CRITICAL_AFTER + 5 + 2 + 8
    assert again < HANDLES_AGAIN_UNDER_LOAD
    assert sorted(handled_ids(database.engine)) == sorted(sent)  # none lost, none twice
    assert direct.peek("jobs") == 0


@pytest.mark.slow
@only("postgresql")
def test_an_idle_endpoint_handles_a_message_sent_right_after_the_heal_within_seconds(
    database, relayed, lines
):
    relay, engine = relayed
    direct = database.transport()
    direct.create_queue("idle")
    handled = threading.Event()
    endpoint = Endpoint("idle", Transport(engine), concurrency=2)
    endpoint.handle(Job, lambda job, context: handled.set())
    endpoint.start()
    try:
        assert endpoint._pump._listener.listening.wait(10)  # type: ignore[union-attr]
        time.sleep(1)
        relay.cut()
        cut_at = time.monotonic()
        time.sleep(IDLE_CUT)
        relay.heal()
        healed_at = time.monotonic()
        direct.send("idle", OutgoingMessage(Job(number=1)))
        assert handled.wait(60), "never handled"
        again = time.monotonic() - healed_at
    finally:
        relay.heal()
        assert endpoint.stop(15)
    warned = lines.first("does not answer", cut_at)
    print(f"\nidle: warned {None if warned is None else round(warned - cut_at, 1)} s into the "
          f"cut, handled {again:.1f} s after the heal")
    assert warned is not None and warned - cut_at < WARNED_WITHIN
    assert again < HANDLES_AGAIN_IDLE



@only("postgresql")
def test_a_long_statement_on_a_database_that_answers_is_left_alone(database, lines):
    watchdog = unanswered.Watchdog(database.engine, after=0.5)
    watchdog.start()
    try:
        with database.engine.connect() as connection:  # checked out after the start: watched
            assert connection.exec_driver_sql("SELECT pg_sleep(3), 1").one()[1] == 1
    finally:
        watchdog.stop()
    assert watchdog.cuts == 0
    assert not [line for at, line in lines.lines if "does not answer" in line]


@pytest.mark.slow
@only("postgresql")
def test_an_async_endpoint_on_psycopg_says_the_database_does_not_answer_and_handles_after_the_heal(
    database, relayed, lines
):
    """The watchdog of an AsyncEndpoint (psycopg's asyncio driver tells a statement waiting)."""
    relay, _ = relayed
    direct = database.transport()
    direct.create_queue("idle")
    url = sa.make_url(database.url).set(
        drivername="postgresql+psycopg", host="127.0.0.1", port=relay.port
    )

    async def body() -> tuple[float, float]:
        handled = asyncio.Event()
        endpoint = AsyncEndpoint(
            "idle", url.render_as_string(hide_password=False), concurrency=2,
            peek_delay=0.2, unanswered_after=1.0,
        )

        @endpoint.handle(Job)
        async def handle(job: Job, context: AsyncHandlerContext) -> None:
            handled.set()

        await endpoint.start()
        try:
            await asyncio.sleep(1)
            relay.cut()
            cut_at = time.monotonic()
            await asyncio.sleep(IDLE_CUT)
            relay.heal()
            healed_at = time.monotonic()
            await asyncio.to_thread(direct.send, "idle", OutgoingMessage(Job(number=1)))
            await asyncio.wait_for(handled.wait(), 60)
            again = time.monotonic() - healed_at
        finally:
            relay.heal()
            await endpoint.close()
        return cut_at, again

    cut_at, again = asyncio.run(body())
    warned = lines.first("does not answer", cut_at)
    print(f"\nasync idle: warned {None if warned is None else round(warned - cut_at, 1)} s "
          f"into the cut, handled {again:.1f} s after the heal")
    assert warned is not None and warned - cut_at < WARNED_WITHIN
    assert again < HANDLES_AGAIN_IDLE
