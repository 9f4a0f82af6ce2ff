"""AsyncEndpoint for an operator: its health beats and live control, as the Endpoint's.

A running AsyncEndpoint writes its instance's heartbeat (counts, concurrency) and its queue's
samples, and a clean stop writes the last sample and says stopped; ``sqlqueue control``'s
pause, resume and concurrency reach it within a poll, and no more async handlers run at once
than the concurrency in force, across a live change; an idle one is woken by another
writer's send, long before its peek delay; with an ``instance_name`` it also receives from its
instance-specific queue. Each test runs once per async driver
(``each_driver``), on an endpoint named afresh so the health rows of one driver's run are
told from another's.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from sqlqueue_orm import OutgoingMessage, Transport, control, db, health
from sqlqueue_orm.aio import AsyncEndpoint, AsyncHandlerContext, AsyncTransport
from tests.endpoint_app import Job
from tests.health_app import BEATING
from tests.integration.test_asyncio import each_driver
from testsupport.outbox_app import count

T = TypeVar("T")


def named(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def eventually(read: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    """Read (on a thread: the reads are synchronous) until *done* holds; a generous deadline."""
    deadline = time.monotonic() + 60
    while True:
        value = await asyncio.to_thread(read)
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what}: last read {value!r}"
        await asyncio.sleep(0.05)


def test_an_async_endpoint_beats_with_its_counts_and_a_clean_stop_says_stopped(database):
    async def body(transport: AsyncTransport) -> None:
        name = named("beats")
        endpoint = AsyncEndpoint(name, transport, settings=BEATING)

        @endpoint.handle(Job)
        async def handle(job: Job, context: AsyncHandlerContext) -> None:
            if job.fail:
                raise RuntimeError("refused")

        def mine() -> list[health.EndpointInstance]:
            return [row for row in health.read_endpoints(database.engine) if row.endpoint == name]

        await endpoint.start()
        try:
            await transport.send_many(
                name, [OutgoingMessage(Job(number=n, fail=n == 0)) for n in range(5)]
            )
            [instance] = await eventually(
                mine,
                lambda found: len(found) == 1 and (found[0].processed, found[0].failed) == (4, 1),
                "the heartbeat's counts",
            )
            assert instance.state == health.RUNNING
            assert instance.process_id == os.getpid()
            assert instance.concurrency == 2
        finally:
            assert await endpoint.stop()
        [stopped] = mine()
        assert (stopped.state, stopped.processed, stopped.failed) == (health.STOPPED, 4, 1)
        metrics = health.read_queue_metrics(database.engine, [name])[name]
        assert sum(sample.processed for sample in metrics.samples) == 4
        assert sum(sample.failed for sample in metrics.samples) == 1
        assert metrics.latest is not None and metrics.latest.depth == 0

    each_driver(database, body)


def test_an_async_endpoint_is_paused_resumed_and_resized_by_the_operator(database):
    async def body(transport: AsyncTransport) -> None:
        name = named("control")
        operator = database.transport()
        await transport.create_queue(name)
        endpoint = AsyncEndpoint(name, transport, peek_delay=0.1, concurrency=2)
        running, most = 0, 0
        #: (when, how many ran then) at each handler's start
        starts: list[tuple[float, int]] = []
        handled: list[str] = []

        @endpoint.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            starts.append((time.monotonic(), running))
            await asyncio.sleep(0.1)
            handled.append(context.message_id)
            running -= 1

        await asyncio.to_thread(control.pause, operator, name)
        await endpoint.start()  # started while paused: starts paused
        try:
            assert endpoint.paused
            await transport.send_many(name, [OutgoingMessage(f"p{n}") for n in range(6)])
            await asyncio.sleep(1.0)
            assert handled == []
            # on a thread: on SQLite the read waits for the write lock, which the endpoint's
            # delayed mover may hold while it awaits the event loop this would block
            assert await asyncio.to_thread(count, database.engine, name) == 6

            await asyncio.to_thread(control.resume, operator, name)
            await eventually(lambda: len(handled), lambda done: done == 6, "handled after resume")

            await asyncio.to_thread(control.set_concurrency, operator, name, 4)
            await eventually(lambda: endpoint.concurrency, lambda now: now == 4, "grown")
            await transport.send_many(name, [OutgoingMessage(f"g{n}") for n in range(16)])
            await eventually(lambda: len(handled), lambda done: done == 22, "handled grown")
            if database.dialect == "postgresql":  # SQLite's one writer: one at a time
                assert most > 2

            # shrunk while handlers run: those begun finish, none starts beyond the new limit
            await transport.send_many(name, [OutgoingMessage(f"s{n}") for n in range(20)])
            await eventually(lambda: running, lambda now: now > 0, "handlers running")
            await asyncio.to_thread(control.set_concurrency, operator, name, 1)
            await eventually(lambda: endpoint.concurrency, lambda now: now == 1, "shrunk")
            # the (at most 4) tasks begun before the shrink finish first, before any begun
            # after it: 4 more handled, and every handler starting later runs alone
            shrunk_at = len(handled)
            await eventually(lambda: len(handled), lambda done: done >= min(42, shrunk_at + 4),
                             "the tasks begun before the shrink done")
            settled = time.monotonic()
            await eventually(lambda: len(handled), lambda done: done == 42, "handled shrunk")
            assert [n for at, n in starts if at > settled and n > 1] == []

            await asyncio.to_thread(control.set_concurrency, operator, name, None)
            await eventually(lambda: endpoint.concurrency, lambda now: now == 2, "configured")
        finally:
            assert await endpoint.stop()
        assert max(n for _, n in starts) <= 4  # never beyond the largest limit in force
        assert len(set(handled)) == len(handled) == 42
        assert count(database.engine, name) == 0

    each_driver(database, body)


def test_a_send_by_another_writer_wakes_an_idle_async_endpoint(database):
    """Not this transport's send (no in-process hook): the database tells, as to an Endpoint."""

    async def body(transport: AsyncTransport) -> None:
        handled = asyncio.Event()
        endpoint = AsyncEndpoint("billing", transport, peek_delay=10.0)

        @endpoint.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            handled.set()

        other_engine = db.create_engine(database.url)
        await endpoint.start()
        try:
            await asyncio.sleep(2.0)  # its receives found nothing: it waits its peek delay
            other = Transport(other_engine)
            began = time.monotonic()
            await asyncio.to_thread(other.send, "billing", OutgoingMessage(b"woken"))
            await asyncio.wait_for(handled.wait(), 8.0)  # the peek delay is 10 s
            assert time.monotonic() - began < 4.0
        finally:
            assert await endpoint.stop()
            other_engine.dispose()

    each_driver(database, body)


def test_an_async_endpoint_receives_from_its_instance_specific_queue(database):
    """``instance_name``: a second queue of this instance, pumped beside the input queue."""

    async def body(transport: AsyncTransport) -> None:
        endpoint = AsyncEndpoint(
            "billing", transport, peek_delay=0.1, instance_name="i1", instance_concurrency=1
        )
        handled: list[tuple[str, str]] = []

        @endpoint.handle_raw
        async def handler(body: bytes, context: AsyncHandlerContext) -> None:
            handled.append((body.decode(), str(context.message.queue)))

        await endpoint.start()
        try:
            instance = endpoint.instance_address
            assert instance is not None
            await transport.send(instance, OutgoingMessage(b"to the instance"))
            await transport.send("billing", OutgoingMessage(b"to the endpoint"))
            deadline = time.monotonic() + 30
            while len(handled) < 2:
                assert time.monotonic() < deadline, handled
                await asyncio.sleep(0.05)
        finally:
            assert await endpoint.stop()
        assert sorted(text for text, _ in handled) == ["to the endpoint", "to the instance"]
        assert endpoint.stats.handled == 1 and endpoint.instance_stats.handled == 1
        assert await transport.peek(instance) == 0
        await transport.purge_all(instance)

    each_driver(database, body)
