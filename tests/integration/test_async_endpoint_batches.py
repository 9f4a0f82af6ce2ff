"""AsyncEndpoint with ``batch_size`` above 1: async handlers in the synchronous batch code.

As an Endpoint's batch (``docs/scale.md``): one transaction receives up to ``batch_size``
messages and commits them together, each message's handlers under a SAVEPOINT of their own; a
failing handler rolls back its own SAVEPOINT, retries in the batch's transaction, then moves
to the error queue, and no other message of its batch notices. Each test runs once per async
driver (``each_driver``): TRANSACTION_SCOPE (the default) everywhere, OUTBOX on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import collections

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions
from sqlqueue_orm.aio import AsyncEndpoint, AsyncHandlerContext, AsyncTransport
from sqlqueue_orm.receiving import TransactionMode
from sqlqueue_orm.sending.outbox import Outbox
from tests.conftest import only
from tests.endpoint_app import Job
from tests.integration.test_asyncio import each_driver
from testsupport.outbox_app import Order, count

BATCH = 5
TOTAL = 23
RETRIES = 1
#: Fail on every try: jobs 7, 14 and 21, each in the middle of a batch of five.
FAILING = {7, 14, 21}


class Boom(Exception):
    pass


def test_async_handlers_in_batches_handle_each_message_once_and_a_failure_only_its_own(database):
    each_driver(database, lambda transport: _every_seventh_fails(database, transport, None))


@only("postgresql", "mssql")  # SQLite refuses OUTBOX: its unit of work writes apart
def test_async_handlers_in_outbox_batches_handle_each_message_once(database):
    Outbox(database.transport()).create_table()
    each_driver(
        database,
        lambda transport: _every_seventh_fails(database, transport, TransactionMode.OUTBOX),
    )


async def _every_seventh_fails(  # type: ignore[no-untyped-def]
    database, transport: AsyncTransport, mode: TransactionMode | None
) -> None:
    """23 messages in batches of 5; jobs 7, 14 and 21 fail every try (*mode*: None, default)."""
    await transport.create_queue("error")
    chosen = {} if mode is None else {"transaction_mode": mode}
    endpoint = AsyncEndpoint(
        "billing",
        transport,
        concurrency=2,
        batch_size=BATCH,
        batch_flush=0.05,
        peek_delay=0.1,
        immediate_retries=RETRIES,
        delayed_retries=0,
        **chosen,
    )
    runs: collections.Counter[int] = collections.Counter()
    transactions: dict[int, int] = {}

    @endpoint.handle(Job)
    async def handle(job: Job, context: AsyncHandlerContext) -> None:
        runs[job.number] += 1
        context.session.add(Order(customer=context.message_id, total=job.number))
        await context.send("shipping", OutgoingMessage(f"ship {job.number}"))
        if database.dialect == "postgresql" and mode is None:
            # the session is in the batch's transaction: one batch, one transaction id
            transactions[job.number] = (
                await context.session.execute(sa.text("SELECT txid_current()"))
            ).scalar_one()
        if job.number in FAILING:
            raise Boom(f"job {job.number} fails")

    sent = await transport.send_many(
        "billing", [OutgoingMessage(Job(number=n)) for n in range(1, TOTAL + 1)]
    )
    failing = {sent[number - 1] for number in FAILING}
    await endpoint.run(once=True)

    async with transport.engine.connect() as connection:
        written = (await connection.execute(sa.select(Order.customer))).scalars().all()
    assert sorted(written) == sorted(set(sent) - failing)  # each once; failed ones undone
    shipped = sorted(m.text for m in await transport.browse("shipping", 100))
    assert shipped == sorted(f"ship {n}" for n in range(1, TOTAL + 1) if n not in FAILING)
    errors = await transport.browse("error", 100)
    assert {m.message_id for m in errors} == failing
    assert runs == {n: 1 + RETRIES if n in FAILING else 1 for n in range(1, TOTAL + 1)}
    stats = endpoint.stats
    assert (stats.handled, stats.failed, stats.retried) == (
        TOTAL - len(FAILING), len(FAILING), len(FAILING) * RETRIES
    )
    assert count(database.engine, "billing") == 0
    if transactions:  # batches happened: far fewer transactions than messages
        assert len(set(transactions.values())) < TOTAL / 2
    await transport.purge_all("error")


def test_a_stop_that_cancels_a_batch_mid_handler_rolls_the_whole_batch_back(database):
    async def body(transport: AsyncTransport) -> None:
        endpoint = AsyncEndpoint(
            "billing", transport, batch_size=BATCH, batch_flush=0.05, peek_delay=0.1,
            delayed_retries=0,
        )
        started = asyncio.Event()
        handled: list[int] = []

        @endpoint.handle(Job)
        async def handle(job: Job, context: AsyncHandlerContext) -> None:
            context.session.add(Order(customer=context.message_id, total=job.number))
            await context.session.flush()
            if job.number == 3:  # the middle of the batch: stuck past the stop's timeout
                started.set()
                await asyncio.sleep(60)
            handled.append(job.number)

        sent = await transport.send_many(
            "billing", [OutgoingMessage(Job(number=n)) for n in range(1, BATCH + 1)]
        )
        await endpoint.start()
        await asyncio.wait_for(started.wait(), 30)
        assert not await endpoint.stop(timeout=0.3)
        assert handled == [1, 2]
        assert count(database.engine, Order) == 0  # the batch's writes rolled back with it
        back = await transport.browse("billing", 100)
        assert [m.message_id for m in back] == sent  # every message back, in its place
        assert await transport.browse("error") == []
        assert await transport.browse("shipping") == []

    each_driver(database, body)


def test_a_mode_that_cannot_keep_a_batch_is_refused_at_start(database):
    async def body(transport: AsyncTransport) -> None:
        endpoint = AsyncEndpoint(
            "billing", transport, batch_size=BATCH, transaction_mode=TransactionMode.NONE
        )

        @endpoint.handle(Job)
        async def handle(job: Job, context: AsyncHandlerContext) -> None:
            """Never runs."""

        with pytest.raises(exceptions.ConfigurationError, match="cannot run in NONE"):
            await endpoint.start()

    each_driver(database, body)
