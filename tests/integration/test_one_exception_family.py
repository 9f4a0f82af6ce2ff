"""Every public call raises :class:`SqlQueueError` when the database cannot be used.

Code that catches ``DatabaseError`` around a send must not miss a raw driver error that another
call of the same object would have translated. Each call below runs against a database that
cannot be reached (a closed port, a login the server refuses, a SQLite file in a directory that
does not exist); it must either succeed without the database or raise a :class:`SqlQueueError`
whose ``__cause__`` is the driver's error. A public method missing from the tables fails the
test, so a new method cannot slip past it.
"""

from __future__ import annotations

import datetime as dt
import inspect
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from sqlqueue_orm import (
    DatabaseError,
    Endpoint,
    OutgoingMessage,
    SqlQueueError,
    Transport,
    UnitOfWork,
)
from sqlqueue_orm.messages import IncomingMessage
from sqlqueue_orm.recoverability.error_queue import ErrorQueue, FailedMessage
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox
from tests.conftest import Database, only
from testsupport import pg_cluster

Call = Callable[[], object]

# Methods that never touch the database: closing, registering handlers, waiting for stop.
_NO_DATABASE = {
    Transport: {"close", "address_text"},
    Endpoint: {
        "close", "handle", "handle_raw", "map_type", "stop", "wait",
        "stats", "instance_stats", "instance_address",
    },
    # These take the caller's connection: its failures are the caller's own (see the test of
    # a send in the caller's transaction below); skipped_for_route reads the dispatcher's memory.
    Outbox: {"close", "store", "store_many", "get", "skipped_for_route"},
    ErrorQueue: set(),
}


def _unusable_urls(database: Database, tmp_path: Any) -> Iterator[tuple[str, str]]:
    """(what is wrong, URL) for the dialect of *database*."""
    url = sa.make_url(database.url)
    if database.dialect == "sqlite":
        yield "missing directory", f"sqlite:///{tmp_path / 'no-such-dir' / 'queue.db'}"
        return
    yield "closed port", url.set(host="127.0.0.1", port=1).render_as_string(hide_password=False)
    yield "unknown role", url.set(
        username="no_such_role", password="wrong"
    ).render_as_string(hide_password=False)
    if database.dialect == "postgresql":
        # the throwaway cluster asks this role, and only it, for its password
        with database.engine.connect() as connection:
            connection.exec_driver_sql(
                f"DO $$ BEGIN CREATE ROLE {pg_cluster.PASSWORD_ROLE} LOGIN PASSWORD 'right'; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
            connection.commit()
        yield "wrong password", url.set(
            username=pg_cluster.PASSWORD_ROLE, password="wrong"
        ).render_as_string(hide_password=False)


def _incoming() -> IncomingMessage:
    return IncomingMessage(
        id=uuid.uuid4(),
        row_version=1,
        headers={"NServiceBus.MessageId": "m-1", "NServiceBus.ReplyToAddress": "billing"},
        body=b"x",
        expired=False,
        raw_headers="{}",
    )


def _transport_calls(transport: Transport) -> dict[str, Call]:
    message = OutgoingMessage(body=b"x")

    def begin() -> None:
        with transport.begin():
            pass

    return {
        "begin": begin,
        "browse": lambda: transport.browse("billing"),
        "browse_delayed": lambda: transport.browse_delayed("billing"),
        "create_delayed_table": lambda: transport.create_delayed_table("billing"),
        "create_queue": lambda: transport.create_queue("billing"),
        "create_queues": lambda: transport.create_queues(["billing", "shipping"]),
        "create_subscription_table": transport.create_subscription_table,
        "list_queues": transport.list_queues,
        "peek": lambda: transport.peek("billing"),
        "publish": lambda: transport.publish(message, topics=["Sales.OrderPlaced"]),
        "purge_all": lambda: transport.purge_all("billing"),
        "purge_expired": lambda: transport.purge_expired("billing"),
        "receive": lambda: transport.receive("billing"),
        "reply": lambda: transport.reply(_incoming(), message),
        "send": lambda: transport.send("billing", message),
        "send_delayed": lambda: transport.send("billing", message, delay=60),
        "send_many": lambda: transport.send_many("billing", [message, message]),
        "subscribe": lambda: transport.subscribe("billing", "Sales.OrderPlaced"),
        "unsubscribe": lambda: transport.unsubscribe("billing", "Sales.OrderPlaced"),
        "subscriptions": lambda: transport.subscriptions,
    }


def _unit_of_work_calls(transport: Transport) -> dict[str, Call]:
    def unit(mode: Any, method: str) -> Call:
        def run() -> None:
            with UnitOfWork(transport, mode=mode) as uow:
                if method == "send":
                    uow.send("billing", OutgoingMessage(body=b"x"))
                else:
                    uow.send_many("billing", [OutgoingMessage(body=b"x")])

        return run

    return {
        f"{method} ({mode})": unit(mode, method)
        for method in ("send", "send_many")
        for mode in ("direct", "outbox")
    }


def _endpoint_calls(transport: Transport) -> dict[str, Call]:
    def endpoint_call(method: str) -> Call:
        def run() -> None:
            endpoint = Endpoint(transport, "billing")
            endpoint.handle_raw(lambda context, message: None)
            try:
                if method == "start":
                    endpoint.start()
                elif method == "run":
                    endpoint.run(once=True)
                elif method == "send":
                    endpoint.send("shipping", OutgoingMessage(body=b"x"))
                elif method == "publish":
                    types = {"NServiceBus.EnclosedMessageTypes": "Sales.OrderPlaced"}
                    endpoint.publish(OutgoingMessage(body=b"x", headers=types))
                elif method == "subscribe":
                    endpoint.subscribe("Sales.OrderPlaced")
                elif method == "address_text":
                    assert endpoint.address_text
                elif method == "prepare_pumps":
                    endpoint.prepare_pumps()
                else:
                    endpoint.unsubscribe("Sales.OrderPlaced")
            finally:
                endpoint.close()

        return run

    return {
        name: endpoint_call(name)
        for name in (
            "start", "run", "send", "publish", "subscribe", "unsubscribe", "address_text",
            "prepare_pumps",
        )
    }


def _outbox_calls(transport: Transport) -> dict[str, Call]:
    outbox = Outbox(transport)
    dispatcher = OutboxDispatcher(outbox)
    week = dt.timedelta(days=7)
    return {
        "create_table": outbox.create_table,
        "backlog": outbox.backlog,
        "waiting_for_retry": outbox.waiting_for_retry,
        "cleanup": lambda: outbox.cleanup(week),
        "cleanup_deliveries": lambda: outbox.cleanup_deliveries(week),
        "dispatch": lambda: outbox.dispatch("m-1"),
        "dispatch_due": outbox.dispatch_due,
        "dispatcher.dispatch_batch": dispatcher.dispatch_batch,
        "dispatcher.dispatch_pending": dispatcher.dispatch_pending,
    }


def _error_queue_calls(transport: Transport) -> dict[str, Call]:
    errors = ErrorQueue(transport)
    failed = _incoming()
    failed.headers["NServiceBus.FailedQ"] = '"public"."billing"'
    return {
        "list": errors.list,
        "get": lambda: errors.get("m-1"),
        "count": errors.count,
        "retry": lambda: errors.retry(["m-1"]),
        "retry_all": errors.retry_all,
        "retryable_ids": errors.retryable_ids,
        "delete": lambda: errors.delete(["m-1"]),
        "table": lambda: errors.table,
        "select_messages": errors.select_messages,
        "message_of": lambda: None,  # turns a row already read into a message: no database
        "shown_queue": lambda: errors.shown_queue(FailedMessage.from_message(failed)),
    }


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    } - _NO_DATABASE.get(cls, set())


@pytest.mark.parametrize(
    ("owner", "calls", "methods_of"),
    [
        ("Transport", _transport_calls, Transport),
        ("UnitOfWork", _unit_of_work_calls, UnitOfWork),
        ("Endpoint", _endpoint_calls, Endpoint),
        ("Outbox", _outbox_calls, Outbox),
        ("ErrorQueue", _error_queue_calls, ErrorQueue),
    ],
)
def test_every_public_call_raises_the_package_s_error_when_the_database_cannot_be_used(
    database: Database,
    tmp_path: Any,
    owner: str,
    calls: Callable[[Transport], dict[str, Call]],
    methods_of: type,
) -> None:
    raw: list[str] = []
    refused: dict[str, list[str]] = {}
    for what, url in _unusable_urls(database, tmp_path):
        transport = Transport(url)
        try:
            table = calls(transport)
            covered = {name.split(" ")[0].removeprefix("dispatcher.") for name in table}
            if methods_of is not UnitOfWork:
                missing = _public_methods(methods_of) - covered - {"connection", "session"}
                missing -= {"already_handled", "stopping"}
                assert not missing, f"{owner}: add these public methods to the test: {missing}"
            for name, call in table.items():
                try:
                    call()
                except SqlQueueError as error:
                    if isinstance(error, DatabaseError):
                        assert error.__cause__ is not None, f"{owner}.{name}: no __cause__"
                        refused.setdefault(what, []).append(str(error))
                except Exception as error:  # the point: nothing else escapes
                    raw.append(f"{what}: {owner}.{name} raised {type(error).__qualname__}")
        finally:
            transport.close()
    assert not raw, "\n".join(raw)
    if "wrong password" in refused and not os.environ.get("SQLQUEUE_TEST_POSTGRES_URL"):
        assert any("password authentication failed" in text for text in refused["wrong password"])


@only("postgresql")
def test_a_send_in_the_caller_s_transaction_raises_the_package_s_error_when_its_connection_dies(
    database: Database, postgres_admin: sa.Engine
) -> None:
    """The caller's own connection dies under a send: DatabaseError, the driver's error as cause.

    The caller's transaction is lost with its connection; nothing of it, the send included,
    was committed.
    """
    transport = Transport(database.engine)
    transport.create_queue("billing")
    with database.engine.connect() as connection:
        transaction = connection.begin()
        backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with postgres_admin.connect() as admin:
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({int(backend)})")
        with pytest.raises(DatabaseError) as raised:
            transport.send("billing", OutgoingMessage(body=b"x"), connection=connection)
        assert isinstance(raised.value.__cause__, sa.exc.DBAPIError)
        assert raised.value.transient
        transaction.rollback()  # what the caller does after any failed statement
    assert transport.peek("billing") == 0


def test_a_pool_with_no_connection_free_raises_the_package_s_error(database: Database) -> None:
    """Every connection of the pool in use past its timeout: a transient DatabaseError."""
    engine = sa.create_engine(database.url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    transport = Transport(engine)
    transport.create_queue("billing")
    try:
        with engine.connect():  # the pool's only connection, held
            for call in (
                lambda: transport.send("billing", OutgoingMessage(body=b"x")),
                lambda: transport.send_many("billing", [OutgoingMessage(body=b"x")] * 2),
                lambda: transport.receive("billing"),
                lambda: transport.browse("billing"),
                transport.list_queues,
            ):
                with pytest.raises(DatabaseError, match="no connection of the pool") as raised:
                    call()
                assert raised.value.transient
                assert isinstance(raised.value.__cause__, sa.exc.TimeoutError)
    finally:
        transport.close()
        engine.dispose()
