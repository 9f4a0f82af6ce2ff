"""AsyncEndpoint: async handlers run by the synchronous endpoint's receive, on every async driver.

Each test runs once per async driver of the database (aiosqlite; asyncpg and psycopg's async
driver) through ``each_driver`` of the asyncio tests: the queues ``billing`` and ``shipping``
and the ``orders`` table, emptied between drivers.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions
from sqlqueue_orm.aio import AsyncEndpoint, AsyncHandlerContext, AsyncTransport
from sqlqueue_orm.receiving import TransactionMode
from tests import async_endpoint_app
from tests.conftest import only
from tests.endpoint_app import Job, UserBase, handled_ids
from tests.integration.test_asyncio import each_driver
from testsupport.outbox_app import REPO, Order, count, sqlqueue_command


def endpoint(transport: AsyncTransport, **settings: object) -> AsyncEndpoint:
    settings = {"peek_delay": 0.1, "delayed_retries": 0, "immediate_retries": 0, **settings}
    return AsyncEndpoint("billing", transport, **settings)


def test_concurrency_is_never_exceeded_with_async_handlers(database):
    async def body(transport: AsyncTransport) -> None:
        running = 0
        spans: list[tuple[float, float]] = []
        most = 0
        ep = endpoint(transport, concurrency=4)

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            began = time.monotonic()
            await asyncio.sleep(0.05)
            spans.append((began, time.monotonic()))
            running -= 1

        await transport.send_many("billing", [OutgoingMessage(f"m{i}") for i in range(24)])
        await ep.run(once=True)
        assert len(spans) == 24
        # from the recorded spans too: at no start were more than 4 running
        for began, _ in spans:
            assert sum(1 for b, e in spans if b <= began < e) <= 4
        assert most <= 4
        assert ep.stats.max_in_flight <= 4
        if database.dialect == "postgresql":  # SQLite's one writer serializes the receives
            assert most > 1
        assert count(database.engine, "billing") == 0

    each_driver(database, body)


def test_a_failing_async_handler_is_retried_then_moved_to_the_error_queue(database):
    async def body(transport: AsyncTransport) -> None:
        attempts = 0
        ep = endpoint(transport, immediate_retries=2)

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            nonlocal attempts
            context.session.add(Order(customer=body.decode(), total=1))
            await context.session.flush()  # written in the receive's transaction...
            if body == b"bad":
                attempts += 1
                raise RuntimeError("bad order")  # ...and rolled back with it

        await transport.send("billing", OutgoingMessage(b"bad"))
        await transport.send("billing", OutgoingMessage(b"good"))
        await ep.run(once=True)
        assert attempts == 3  # the first try and two immediate retries
        assert ep.stats.failed == 1 and ep.stats.retried == 2 and ep.stats.handled == 1
        [moved] = await transport.browse("error")
        assert moved.text == "bad"
        assert moved.headers["NServiceBus.ExceptionInfo.Message"] == "bad order"
        assert count(database.engine, Order) == 1  # "good" only
        assert count(database.engine, "billing") == 0
        await transport.purge_all("error")

    each_driver(database, body)


def test_a_failing_async_handler_goes_through_delayed_retries(database):
    async def body(transport: AsyncTransport) -> None:
        attempts = 0
        ep = endpoint(transport, delayed_retries=1, delayed_retry_increase=0.5)

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            nonlocal attempts
            attempts += 1
            raise RuntimeError("still bad")

        await transport.send("billing", OutgoingMessage(b"bad"))
        await ep.start()
        deadline = time.monotonic() + 30
        while ep.stats.failed == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await ep.stop()
        assert (ep.stats.delayed, ep.stats.failed, attempts) == (1, 1, 2)
        assert [m.text for m in await transport.browse("error")] == ["bad"]
        await transport.purge_all("error")

    each_driver(database, body)


@pytest.mark.parametrize(
    "mode", [TransactionMode.TRANSACTION_SCOPE, TransactionMode.NONE]
)
def test_an_async_handlers_session_and_sends_commit_as_the_mode_says(database, mode):
    async def body(transport: AsyncTransport) -> None:
        ep = endpoint(transport, transaction_mode=mode)

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            context.session.add(Order(customer=body.decode(), total=1))
            await context.send("shipping", OutgoingMessage(b"ship " + body))
            if body == b"bad":
                raise RuntimeError("bad")

        await transport.send("billing", OutgoingMessage(b"good"))
        await transport.send("billing", OutgoingMessage(b"bad"))
        await ep.run(once=True)
        customers = {o for (o,) in await _orders(transport)}
        assert customers == {"good"}  # the failed one's write rolled back in both modes
        shipped = sorted(m.text for m in await transport.browse("shipping"))
        if mode is TransactionMode.TRANSACTION_SCOPE:
            assert shipped == ["ship good"]  # the send rolled back with the receive
        else:  # NONE: sends leave as they are made (on SQLite: with the session's commit)
            assert "ship good" in shipped
        assert count(database.engine, "billing") == 0
        assert [m.text for m in await transport.browse("error")] == ["bad"]
        await transport.purge_all("error")

    each_driver(database, body)


async def _orders(transport: AsyncTransport) -> list[tuple[str]]:
    async with transport.engine.connect() as connection:
        rows = await connection.execute(sa.select(Order.customer))
        return [(row[0],) for row in rows]


def test_a_stop_waits_for_the_async_handlers_in_flight(database):
    async def body(transport: AsyncTransport) -> None:
        ep = endpoint(transport, concurrency=2)
        started = asyncio.Event()
        finished: list[str] = []

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            context.session.add(Order(customer=body.decode(), total=1))
            started.set()
            await asyncio.sleep(0.5)
            finished.append(body.decode())

        await transport.send("billing", OutgoingMessage(b"slow"))
        await ep.start()
        await asyncio.wait_for(started.wait(), 30)
        assert await ep.stop(timeout=30)
        assert finished == ["slow"]
        assert count(database.engine, Order) == 1
        assert count(database.engine, "billing") == 0

    each_driver(database, body)


def stuck_endpoint(transport: AsyncTransport) -> tuple[AsyncEndpoint, asyncio.Event]:
    """An endpoint whose handler writes a row, sets the event, then runs for a minute."""
    ep = endpoint(transport)
    started = asyncio.Event()

    @ep.handle_raw
    async def handler(body: bytes, context: AsyncHandlerContext) -> None:
        context.session.add(Order(customer="never", total=1))
        await context.session.flush()
        started.set()
        await asyncio.sleep(60)

    return ep, started


def test_a_stop_past_its_timeout_cancels_the_handler_and_its_message_returns(database):
    async def body(transport: AsyncTransport) -> None:
        ep, started = stuck_endpoint(transport)
        await transport.send("billing", OutgoingMessage(b"stuck"))
        await ep.start()
        await asyncio.wait_for(started.wait(), 30)
        began = time.monotonic()
        assert not await ep.stop(timeout=0.3)
        assert time.monotonic() - began < 20
        assert count(database.engine, Order) == 0  # rolled back with the receive
        assert [m.text for m in await transport.browse("billing")] == ["stuck"]
        assert await transport.browse("error") == []

    each_driver(database, body)


def test_a_stop_cancels_the_handlers_before_it_waits_for_a_delayed_move_they_block(database):
    # On SQLite a due delayed message's move waits for the write lock the handler's
    # transaction holds: the stop must roll the handler back first, not wait for the move.
    async def body(transport: AsyncTransport) -> None:
        ep, started = stuck_endpoint(transport)
        await transport.create_queue("billing")
        await transport.create_delayed_table("billing")
        await transport.send("billing", OutgoingMessage(b"later"), delay=1.0)
        await transport.send("billing", OutgoingMessage(b"stuck"))
        await ep.start()
        await asyncio.wait_for(started.wait(), 30)
        await asyncio.sleep(2.0)  # the delayed message is due: the mover tries to move it
        began = time.monotonic()
        assert not await ep.stop(timeout=0.3)
        assert time.monotonic() - began < 10
        assert count(database.engine, Order) == 0  # rolled back with the receive
        waiting = [m.body for m in await transport.browse("billing")]
        delayed = [m.body for m in await transport.browse_delayed("billing")]
        assert sorted(waiting + delayed) == [b"later", b"stuck"]  # each once, none lost
        assert b"stuck" in waiting

    each_driver(database, body)


def test_a_synchronous_handler_is_refused_with_the_reason(database):
    async def body(transport: AsyncTransport) -> None:
        ep = endpoint(transport)
        with pytest.raises(exceptions.ConfigurationError, match="async def"):
            ep.handle_raw(lambda body, context: None)  # type: ignore[arg-type,return-value]

    each_driver(database, body)


def test_a_process_killed_mid_handler_loses_nothing_and_handles_nothing_twice(database):
    async def body(transport: AsyncTransport) -> None:
        engine = database.engine
        async with transport.engine.begin() as connection:
            await connection.run_sync(UserBase.metadata.drop_all)
            await connection.run_sync(UserBase.metadata.create_all)
        await transport.create_queue(async_endpoint_app.QUEUE)
        total = 60
        sent = await transport.send_many(
            async_endpoint_app.QUEUE, [OutgoingMessage(Job(number=n)) for n in range(total)]
        )
        url = transport.engine.url.render_as_string(hide_password=False)
        for kill_at in (9, 23):
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.async_endpoint_app", url, str(kill_at)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            _, stderr = await asyncio.to_thread(process.communicate, timeout=120)
            assert process.returncode == -9, stderr  # killed mid-handler, not finished
        assert 0 < count(engine, async_endpoint_app.QUEUE) < total
        await async_endpoint_app.build(transport).run(once=True)
        handled = handled_ids(engine)
        assert sorted(set(handled)) == sorted(sent)  # nothing lost
        assert len(handled) == len(sent)  # nothing handled twice
        await transport.purge_all(async_endpoint_app.QUEUE)

    each_driver(database, body)


def test_concurrent_async_handlers_sending_at_once_each_send_once(database):
    """NONE: each send takes a connection of its own (the loop's thread keeps none for them)."""

    async def body(transport: AsyncTransport) -> None:
        ep = endpoint(transport, transaction_mode=TransactionMode.NONE, concurrency=4)

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            for number in range(5):
                await context.send("shipping", OutgoingMessage(body + b"-%d" % number))

        await transport.send_many("billing", [OutgoingMessage(f"m{i}") for i in range(16)])
        await ep.run(once=True)
        assert ep.stats.handled == 16 and ep.stats.failed == 0
        shipped = sorted(m.text for m in await transport.browse("shipping", 1_000))
        assert shipped == sorted(f"m{i}-{n}" for i in range(16) for n in range(5))

    each_driver(database, body)


def test_sqlqueue_run_once_runs_an_async_endpoint(database):
    transport = database.transport()
    UserBase.metadata.create_all(transport.engine)
    transport.create_queue(async_endpoint_app.QUEUE)
    sent = transport.send_many(
        async_endpoint_app.QUEUE, [OutgoingMessage(Job(number=n)) for n in range(50)]
    )
    result = subprocess.run(
        [*sqlqueue_command(), "--url", database.url, "run", "tests.async_endpoint_app:endpoint",
         "--once"],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert "50 message(s)" in line and "handled 50, failed 0" in line
    assert sorted(handled_ids(database.engine)) == sorted(sent)


@only("postgresql", "mssql")  # SQLite refuses these modes: they write on a second connection
@pytest.mark.parametrize(
    "mode",
    [TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, TransactionMode.RECEIVE_ONLY,
     TransactionMode.OUTBOX],
)
def test_the_modes_whose_session_is_apart_run_async_handlers(database, mode):
    async def body(transport: AsyncTransport) -> None:
        ep = endpoint(transport, transaction_mode=mode)

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            context.session.add(Order(customer=body.decode(), total=1))
            await context.send("shipping", OutgoingMessage(b"ship " + body))
            await context.session.flush()
            if body == b"bad":
                raise RuntimeError("bad")

        await transport.send("billing", OutgoingMessage(b"good"))
        await transport.send("billing", OutgoingMessage(b"bad"))
        await ep.run(once=True)
        assert {o for (o,) in await _orders(transport)} == {"good"}  # the session rolled back
        shipped = sorted(m.text for m in await transport.browse("shipping"))
        if mode is TransactionMode.RECEIVE_ONLY:  # its sends leave at once: a ghost
            assert shipped == ["ship bad", "ship good"]
        else:  # in the receive's transaction, or the unit of work's outbox
            assert shipped == ["ship good"]
        assert [m.text for m in await transport.browse("error")] == ["bad"]
        assert count(database.engine, "billing") == 0
        await transport.purge_all("error")

    each_driver(database, body)


def test_flow_control_limits_async_handlers_and_its_waits_leave_the_event_loop_running(database):
    """One message per key at a time and the rate limit hold as for synchronous handlers.

    The rate limit's wait for a message's start is awaited on the event loop: the other tasks
    (here a ticker) run on through it, where a blocking sleep would stop them all.
    """

    async def body(transport: AsyncTransport) -> None:
        keys = ["slow", "a"]
        await transport.send_many(
            "billing",
            [
                OutgoingMessage(Job(number=n), headers={"customer": key})
                for n in range(3)
                for key in keys
            ],
        )
        # SQLite: NONE lets handlers run at once (one writer); a server holds key slots in
        # the receive's transaction
        mode = TransactionMode.NONE if database.dialect == "sqlite" else None
        ep = endpoint(
            transport,
            concurrency=3,
            key_header="customer",
            rate_limit=2,
            rate_burst=1,
            **({"transaction_mode": mode} if mode is not None else {}),
        )
        running: dict[str, int] = {}
        peak: dict[str, int] = {}
        starts: list[float] = []

        @ep.handle(Job)
        async def handle(job: Job, context: AsyncHandlerContext) -> None:
            key = context.headers["customer"] or ""
            starts.append(time.monotonic())
            running[key] = running.get(key, 0) + 1
            peak[key] = max(peak.get(key, 0), running[key])
            await asyncio.sleep(0.6 if key == "slow" else 0.01)
            running[key] -= 1

        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await ep.start()
        try:
            deadline = time.monotonic() + 60
            while len(starts) < 6 or any(running.values()):
                assert time.monotonic() < deadline, starts
                await asyncio.sleep(0.05)
        finally:
            await ep.stop()
            ticker.cancel()
        assert peak == dict.fromkeys(keys, 1)
        # 2 a second, a burst of 1: six starts span at least 2.5 s (a margin for clocks)
        assert starts[-1] - starts[0] >= 2.2
        # each start waits about 0.5 s; awaited, the ticker never stops that long
        assert max(gaps) < 0.3, max(gaps)
        assert count(database.engine, "billing") == 0

    each_driver(database, body)


def test_a_fast_rate_limit_and_a_global_limit_run_async_handlers_through(database):
    """The limits' locks of the process, which a task holds across a statement, never stop the
    event loop: another task waiting for one lets the loop run on (blocking, it never ended)."""

    async def body(transport: AsyncTransport) -> None:
        total = 120
        await transport.send_many("billing", [OutgoingMessage(b"x") for _ in range(total)])
        ep = endpoint(transport, concurrency=4, rate_limit=400, global_concurrency=2)
        running, most, handled = 0, 0, 0

        @ep.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            nonlocal running, most, handled
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.005)
            running -= 1
            handled += 1

        await ep.start()
        try:
            deadline = time.monotonic() + 60
            while handled < total:
                assert time.monotonic() < deadline, handled
                await asyncio.sleep(0.05)
        finally:
            assert await ep.stop(10)
        assert most <= 2
        assert count(database.engine, "billing") == 0

    each_driver(database, body)
