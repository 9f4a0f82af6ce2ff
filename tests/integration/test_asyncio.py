"""asyncio: sends, receives and a unit of work in an AsyncConnection's or AsyncSession's
transaction commit with it or not at all, on every async driver of each database.

Each test runs its body once per async driver of the database (aiosqlite; asyncpg and
psycopg's async driver), each on its own queues and tables of the ``database`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from sqlqueue_orm import OutgoingMessage, exceptions, headers
from sqlqueue_orm.aio import AsyncTransport, AsyncUnitOfWork, create_async_engine
from sqlqueue_orm.receiving import Endpoint, HandlerContext
from sqlqueue_orm.sending.outbox import Outbox
from tests.endpoint_app import Job
from testsupport.outbox_app import Order, UserBase, count, outbox_rows

#: The async drivers of each database (the first: what a URL naming none gets).
ASYNC_DRIVERS = {"sqlite": ("aiosqlite",), "postgresql": ("asyncpg", "psycopg"),
                 "mssql": ("aioodbc",)}


class Boom(Exception):
    pass


def async_url(database, driver: str) -> str:  # type: ignore[no-untyped-def]
    """The database's URL with *driver*, the async driver."""
    url = sa.make_url(database.url)
    return url.set(drivername=f"{url.get_backend_name()}+{driver}").render_as_string(
        hide_password=False
    )


def each_driver(database, body: Callable[[AsyncTransport], Awaitable[None]]) -> None:  # type: ignore[no-untyped-def]
    """Run *body* with a fresh AsyncTransport per async driver; the tables emptied between."""
    for driver in ASYNC_DRIVERS[database.dialect]:
        async def run(driver: str) -> None:
            transport = AsyncTransport(async_url(database, driver))
            try:
                await transport.create_queue("billing")
                await transport.create_queue("shipping")
                async with transport.engine.begin() as connection:
                    await connection.run_sync(UserBase.metadata.create_all)
                await body(transport)
            finally:
                await transport.purge_all("billing")
                await transport.purge_all("shipping")
                async with transport.engine.begin() as connection:
                    await connection.execute(sa.delete(Order))
                await transport.close()

        asyncio.run(run(driver))


def test_an_async_session_commits_its_row_and_the_send_together(database):
    async def body(transport: AsyncTransport) -> None:
        async with AsyncSession(transport.engine) as session, session.begin():
            session.add(Order(customer="ann", total=1))
            await transport.send("billing", OutgoingMessage(b"invoice"), session)
        assert count(database.engine, Order) == 1
        assert count(database.engine, "billing") == 1

        async with AsyncSession(transport.engine) as session:
            async with session.begin():
                session.add(Order(customer="bob", total=2))
                await transport.send("billing", OutgoingMessage(b"rolled back"), session)
                await session.rollback()
        with pytest.raises(Boom):
            async with AsyncSession(transport.engine) as session, session.begin():
                session.add(Order(customer="cy", total=3))
                await transport.send("billing", OutgoingMessage(b"raised"), session)
                raise Boom
        assert count(database.engine, Order) == 1
        assert count(database.engine, "billing") == 1

    each_driver(database, body)


def test_sends_of_every_kind_join_an_async_connections_transaction(database):
    """send, send_many, publish and a deferred send: all commit with it, or none."""

    async def sends(transport: AsyncTransport, connection: object) -> None:
        await transport.send("billing", OutgoingMessage(b"one"), connection)  # type: ignore[arg-type]
        await transport.send_many(
            "billing", [OutgoingMessage(b"a"), OutgoingMessage(b"b")], connection  # type: ignore[arg-type]
        )
        await transport.publish(
            OutgoingMessage(b"event", headers={headers.ENCLOSED_MESSAGE_TYPES: "Paid"}),
            connection,  # type: ignore[arg-type]
        )
        await transport.send("billing", OutgoingMessage(b"later"), connection, delay=3600)  # type: ignore[arg-type]

    async def body(transport: AsyncTransport) -> None:
        await transport.create_subscription_table()
        await transport.create_delayed_table("billing")
        await transport.subscribe("shipping", "Paid")
        with pytest.raises(Boom):
            async with transport.engine.begin() as connection:
                await sends(transport, connection)
                raise Boom
        assert count(database.engine, "billing") == 0
        assert count(database.engine, "shipping") == 0
        assert await transport.browse_delayed("billing") == []

        async with transport.engine.begin() as connection:
            await sends(transport, connection)
        assert count(database.engine, "billing") == 3
        assert count(database.engine, "shipping") == 1
        assert len(await transport.browse_delayed("billing")) == 1
        await transport.unsubscribe("shipping", "Paid")
        async with transport.engine.begin() as connection:
            delayed = transport.transport.queues.delayed_address("billing")
            await connection.execute(sa.delete(sa.table(delayed.table, schema=delayed.schema)))

    each_driver(database, body)


@pytest.mark.parametrize("mode", ["direct", "outbox"])
def test_an_async_unit_of_work_commits_both_or_neither(database, mode):
    Outbox(database.transport()).create_table()

    async def body(transport: AsyncTransport) -> None:
        async with AsyncUnitOfWork(transport, mode=mode) as uow:
            uow.session.add(Order(customer="ann", total=1))
            await uow.send("billing", OutgoingMessage(b"1"))
            await uow.send_many("shipping", [OutgoingMessage(b"a"), OutgoingMessage(b"b")])
        assert uow.committed
        assert dict(uow.sent) == {uow.transport.transport.queues.address("billing").__str__(): 1,
                                  uow.transport.transport.queues.address("shipping").__str__(): 2}

        with pytest.raises(Boom):
            async with AsyncUnitOfWork(transport, mode=mode) as uow:
                uow.session.add(Order(customer="bob", total=2))
                await uow.session.flush()  # written in the transaction...
                await uow.send("billing", OutgoingMessage(b"2"))
                raise Boom  # ...and rolled back with the send
        assert not uow.committed
        assert count(database.engine, Order) == 1
        assert count(database.engine, "billing") == 1
        assert count(database.engine, "shipping") == 2
        assert len(outbox_rows(database.engine)) == (1 if mode == "outbox" else 0)
        with pytest.raises(exceptions.SqlQueueError, match="not open"):
            _ = uow.session
        with database.engine.begin() as connection:  # for the next driver
            connection.execute(sa.text('DELETE FROM "OutboxData"'))

    each_driver(database, body)


def test_a_task_cancelled_mid_transaction_commits_neither_row_nor_send(database):
    async def body(transport: AsyncTransport) -> None:
        inside = asyncio.Event()

        async def unit() -> None:
            async with AsyncUnitOfWork(transport) as uow:
                uow.session.add(Order(customer="ann", total=1))
                await uow.session.flush()
                await uow.send("billing", OutgoingMessage(b"cancelled"))
                inside.set()
                await asyncio.sleep(60)

        async def session() -> None:
            async with AsyncSession(transport.engine) as own, own.begin():
                own.add(Order(customer="bob", total=2))
                await transport.send("billing", OutgoingMessage(b"cancelled"), own)
                inside.set()
                await asyncio.sleep(60)

        for work in (unit, session):
            inside.clear()
            task = asyncio.create_task(work())
            await asyncio.wait_for(inside.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert count(database.engine, Order) == 0
            assert count(database.engine, "billing") == 0
        # and the pool's connections are fine afterwards
        await transport.send("billing", OutgoingMessage(b"after"))
        assert count(database.engine, "billing") == 1

    each_driver(database, body)


def test_an_async_receive_in_a_rolled_back_transaction_puts_the_messages_back(database):
    async def body(transport: AsyncTransport) -> None:
        await transport.send_many("billing", [OutgoingMessage(f"m{i}") for i in range(5)])
        with pytest.raises(Boom):
            async with AsyncSession(transport.engine) as session, session.begin():
                taken = await transport.receive("billing", 3, session)
                assert [m.body for m in taken] == [b"m0", b"m1", b"m2"]
                raise Boom
        async with transport.engine.connect() as connection:
            taken = await transport.receive("billing", 10, connection)
            assert len(taken) == 5
            await connection.rollback()
        assert await transport.peek("billing") == 5
        assert [m.body for m in await transport.browse("billing", 2)] == [b"m0", b"m1"]
        # committed: gone; on its own: taken and committed before it returns
        async with transport.engine.begin() as connection:
            assert [m.body for m in await transport.receive("billing", 2, connection)] == [
                b"m0", b"m1"
            ]
        assert [m.body for m in await transport.receive("billing", 10)] == [b"m2", b"m3", b"m4"]
        assert count(database.engine, "billing") == 0

    each_driver(database, body)


def test_an_async_send_writes_the_rows_a_synchronous_send_writes(database):
    """The same wire format: headers and body of an async send are a sync send's."""
    sync = database.transport()

    async def body(transport: AsyncTransport) -> None:
        def message() -> OutgoingMessage:  # two rows (a row id each), one message id
            return OutgoingMessage(
                b"\x00\x01body", headers={headers.ENCLOSED_MESSAGE_TYPES: "X"}, message_id="m-1"
            )

        sync.send("shipping", message())
        await transport.send("shipping", message())
        first, second = sync.browse("shipping")
        assert first.body == second.body
        assert first.message_id == second.message_id
        drop = {headers.TIME_SENT}
        assert {k: v for k, v in first.headers.items() if k not in drop} == {
            k: v for k, v in second.headers.items() if k not in drop
        }

    each_driver(database, body)


def test_an_async_send_many_of_new_messages_warns_of_no_duplicates(database, caplog):
    async def body(transport: AsyncTransport) -> None:
        with caplog.at_level(logging.WARNING, logger="sqlqueue_orm"):
            async with transport.engine.begin() as connection:
                await transport.send_many(
                    "billing", [OutgoingMessage(b"a"), OutgoingMessage(b"b")], connection
                )
        assert count(database.engine, "billing") == 2
        assert not [r for r in caplog.records if "already queued" in r.getMessage()]

    each_driver(database, body)


def test_an_async_send_in_a_session_wakes_an_idle_endpoint_after_the_commit(database):
    handled = threading.Event()
    endpoint = Endpoint("idle", database.transport(), peek_delay=10.0)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        handled.set()

    async def body(transport: AsyncTransport) -> None:
        await transport.create_queue("idle")
        endpoint.start()
        try:
            time.sleep(0.5)  # the first peek found nothing: the pump sleeps its peek delay
            for _ in range(2):
                handled.clear()
                began = time.monotonic()
                async with AsyncSession(transport.engine) as session, session.begin():
                    await transport.send("idle", OutgoingMessage(Job(number=1)), session)
                    await asyncio.sleep(0.3)
                    assert not handled.is_set()  # not before the commit
                assert await asyncio.to_thread(handled.wait, 5.0), "not woken"
                assert time.monotonic() - began < 3.0
        finally:
            endpoint.stop()

    each_driver(database, body)


def test_create_async_engine_gives_a_url_naming_no_driver_the_async_one(database):
    url = sa.make_url(database.url)
    engine = create_async_engine(url.set(drivername=url.get_backend_name()))
    try:
        assert engine.dialect.driver == ASYNC_DRIVERS[database.dialect][0]
        assert engine.dialect.is_async
    finally:
        asyncio.run(engine.dispose())


def test_create_async_engine_and_async_transport_refuse_bad_input(tmp_path):
    with pytest.raises(exceptions.ConfigurationError, match="asyncio"):
        create_async_engine(f"sqlite+pysqlite:///{tmp_path}/x.db")
    with pytest.raises(exceptions.ConfigurationError, match="sqlite_synchronous"):
        create_async_engine(f"sqlite:///{tmp_path}/x.db", sqlite_synchronous="SOMETIMES")
    with pytest.raises(exceptions.ConfigurationError, match="not a URL"):
        create_async_engine("not a URL")
    with pytest.raises(exceptions.ConfigurationError, match="AsyncTransport needs"):
        AsyncTransport(sa.create_engine("sqlite://"))  # type: ignore[arg-type]


def test_concurrent_async_units_of_work_commit_each_of_their_sends_once(database):
    """Twenty tasks at once on one transport, every other one failing: each committed send is
    there once, nothing of a failed one, and no task used another's connection."""
    Outbox(database.transport()).create_table()

    async def body(transport: AsyncTransport) -> None:
        async def unit(number: int) -> None:
            async with AsyncUnitOfWork(transport, mode="outbox" if number % 4 < 2 else "direct",
                                       incoming_message_id=f"in-{number}") as uow:
                uow.session.add(Order(customer=f"c{number}", total=number))
                await asyncio.sleep(0.01 * (number % 3))
                await uow.send("billing", OutgoingMessage(f"{number}", message_id=f"m-{number}"))
                await asyncio.sleep(0.01 * (number % 2))
                if number % 2:
                    raise Boom

        outcomes = await asyncio.gather(*(unit(n) for n in range(20)), return_exceptions=True)
        assert [type(o) for o in outcomes] == [type(None), Boom] * 10
        async with transport.engine.connect() as connection:
            received = await transport.receive("billing", 100, connection)
            await connection.rollback()
        assert sorted(m.message_id for m in received) == sorted(f"m-{n}" for n in range(0, 20, 2))
        assert count(database.engine, Order) == 10
        with database.engine.begin() as connection:  # for the next driver
            connection.execute(sa.text('DELETE FROM "OutboxData"'))

    each_driver(database, body)


def test_an_async_call_on_an_unreachable_database_raises_the_packages_error(database):
    url = sa.make_url(database.url)
    if database.dialect == "sqlite":
        bad = "sqlite:////nonexistent-directory/x/queue.db"
    else:
        bad = url.set(port=1, drivername=f"{url.get_backend_name()}+"
                      f"{ASYNC_DRIVERS[database.dialect][0]}").render_as_string(False)

    async def calls() -> None:
        async with AsyncTransport(bad) as transport:
            for call in (lambda: transport.send("billing", OutgoingMessage(b"x")),
                         lambda: transport.receive("billing"),
                         lambda: transport.peek("billing")):
                with pytest.raises(exceptions.SqlQueueError):
                    await call()
            with pytest.raises(exceptions.SqlQueueError):
                async with AsyncUnitOfWork(transport):
                    pass

    asyncio.run(calls())


def test_an_async_reply_joins_the_transaction_of_the_receive_it_answers(database):
    async def body(transport: AsyncTransport) -> None:
        reply_to = transport.address_text("shipping")
        await transport.send("billing", OutgoingMessage(b"ask", headers={
            headers.REPLY_TO_ADDRESS: reply_to}, message_id="question"))
        for outcome in ("rolled back", "committed"):
            with pytest.raises(Boom) if outcome == "rolled back" else contextlib.nullcontext():
                async with AsyncSession(transport.engine) as session, session.begin():
                    [incoming] = await transport.receive("billing", 1, session)
                    await transport.reply(incoming, OutgoingMessage(b"answer"), session)
                    if outcome == "rolled back":
                        raise Boom
        [answer] = await transport.receive("shipping")
        assert answer.headers[headers.CORRELATION_ID] == "question"
        assert answer.headers[headers.MESSAGE_INTENT] == "Reply"
        assert count(database.engine, "billing") == 0

    each_driver(database, body)
