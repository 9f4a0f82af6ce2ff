"""Native delayed delivery: ``<endpoint>.Delayed``, the mover, forwarding, and delayed retries.

Every test runs on a real database (SQLite file, PostgreSQL cluster; SQL Server when configured).
Delays are short (a fraction of a second) and every wait polls for its condition with a deadline.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions, headers
from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION
from sqlqueue_orm.receiving import Endpoint, HandlerContext, TransactionMode, retries

#: How late after its due time a delayed message may be handled (the mover wakes for the due
#: time; the margin absorbs a loaded machine shared by several test runs).
MARGIN = 3.0
#: SQLite keeps Due to the millisecond (truncated), SQL Server's datetime to 1/300 s.
CLOCK_GRAIN = 0.005


def wait_for(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def recording_endpoint(database, name: str = "sales", **settings):  # type: ignore[no-untyped-def]
    """An endpoint whose raw handler records (monotonic time, body, headers) per message."""
    endpoint = Endpoint(name, database.transport(), peek_delay=0.1, **settings)
    seen: list[tuple[float, bytes, dict[str, str | None]]] = []

    @endpoint.handle_raw
    def record(body: bytes, context: HandlerContext) -> None:
        seen.append((time.monotonic(), body, dict(context.headers)))

    return endpoint, seen


def delayed_rows(database, endpoint: str = "sales") -> int:  # type: ignore[no-untyped-def]
    transport = database.transport()
    table = transport.queues.delayed_table(endpoint)
    with database.engine.connect() as connection:
        return int(
            connection.exec_driver_sql(
                f"SELECT COUNT(*) FROM {table_sql(transport, table.address)}"
            ).scalar_one()
        )


def table_sql(transport, address) -> str:  # type: ignore[no-untyped-def]
    from sqlqueue_orm.queuing import sql

    return sql.format_table(transport.engine.dialect, address)


def test_delayed_message_arrives_not_before_due_and_soon_after(database):
    endpoint, seen = recording_endpoint(database)
    endpoint.start()
    try:
        sent_at = time.monotonic()
        endpoint.send("sales", b"later", delay=0.8)
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.5)
        endpoint.send("sales", b"at", deliver_at=at)
        endpoint.send("sales", b"now")
        wait_for(lambda: len(seen) == 3)
    finally:
        endpoint.stop(10)
    by_body = {body: moment for moment, body, _ in seen}
    assert [body for _, body, _ in seen] == [b"now", b"at", b"later"]
    assert by_body[b"later"] >= sent_at + 0.8 - CLOCK_GRAIN
    assert by_body[b"later"] - (sent_at + 0.8) < MARGIN
    assert by_body[b"at"] >= sent_at + 0.5 - CLOCK_GRAIN
    assert all(FORWARD_DESTINATION not in carried for _, _, carried in seen)
    assert delayed_rows(database) == 0


def test_delayed_message_survives_an_endpoint_restart(database):
    endpoint, seen = recording_endpoint(database)
    endpoint.start()
    sent_at = time.monotonic()
    endpoint.send("sales", b"across a restart", delay=0.6)
    endpoint.stop(10)
    assert seen == [] and delayed_rows(database) == 1
    time.sleep(max(0.0, sent_at + 0.7 - time.monotonic()))  # due while nobody runs
    again, seen_again = recording_endpoint(database)
    again.start()
    try:
        wait_for(lambda: len(seen_again) == 1)
        time.sleep(0.3)  # nothing else arrives
    finally:
        again.stop(10)
    assert [body for _, body, _ in seen_again] == [b"across a restart"]
    assert seen_again[0][0] >= sent_at + 0.6 - CLOCK_GRAIN
    assert delayed_rows(database) == 0


def test_two_movers_move_each_delayed_message_once(database):
    transport = database.transport()
    transport.create_queue("sales")
    transport.create_delayed_table("sales")
    count = 60
    with database.engine.begin() as connection:
        for number in range(count):
            transport.send(
                "sales",
                OutgoingMessage(f"m{number}".encode(), message_id=f"id-{number}"),
                connection=connection,
                delay=0,
            )
    table = transport.queues.delayed_table("sales")
    time.sleep(0.05)  # all due
    moved: list[int] = []
    errors: list[BaseException] = []

    def mover() -> None:
        try:
            while True:
                with database.engine.begin() as connection:
                    batch = table.move_due(connection, 7)
                moved.append(batch)
                if batch == 0:
                    return
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=mover) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sum(moved) == count
    received = transport.receive("sales", count + 10)
    assert sorted(message.message_id for message in received) == sorted(
        f"id-{number}" for number in range(count)
    )
    assert {message.body for message in received} == {f"m{n}".encode() for n in range(count)}
    assert delayed_rows(database) == 0


def _insert_as_nservicebus(database, transport, text: str, body: bytes) -> None:  # type: ignore[no-untyped-def]
    """Insert a delayed row with the .NET transport's own statement (StoreDelayedMessageText)."""
    address = transport.queues.delayed_address("sales")
    table = table_sql(transport, address)
    if database.dialect == "postgresql":
        # PostgreSqlConstants.StoreDelayedMessageText, @Name parameters as :name.
        statement = (
            "WITH params (DueDate) as ("
            "   values (timestamptz (now() AT TIME ZONE 'UTC') + (:days || ' days ')::INTERVAL"
            " + (:hours || ' hours ')::INTERVAL + (:minutes || ' mins ')::INTERVAL"
            " + (:seconds || ' s ')::INTERVAL + (:ms || ' ms')::INTERVAL)"
            f") INSERT INTO {table} (Headers, Body, Due) "
            "SELECT :headers, :body, DueDate FROM params"
        )
        values = {"days": 0, "hours": 0, "minutes": 0, "seconds": 0, "ms": 200}
    else:
        # SqlServerConstants.StoreDelayedMessageText's INSERT, with @DueAfter computed as the
        # DATEADDs do (SQLite has no DATEADD: the same UTC time as text).
        statement = f"INSERT INTO {table} (Headers, Body, Due) VALUES (:headers, :body, :due)"
        due = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=200)
        values = {"due": due.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]}
    with database.engine.begin() as connection:
        connection.execute(sa.text(statement), {**values, "headers": text, "body": body})


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("forwarded", [False, True], ids=["local", "forwarded"])
def test_a_row_written_by_nservicebus_is_moved_and_delivered(database, forwarded, batched):
    transport = database.transport()
    transport.create_queue("billing")
    destination = transport.address_text("billing" if forwarded else "sales")
    message_id = str(uuid.uuid4())
    # As .NET writes headers: "/" escaped as "\/", the destination in ForwardDestination.
    text = (
        '{"NServiceBus.MessageId":"' + message_id + '",'
        '"NServiceBus.ContentType":"text\\/plain",'
        '"NServiceBus.SqlServer.ForwardDestination":'
        + headers.serialize({"x": destination})[5:-1]
        + "}"
    )
    body = bytes(range(256))
    # batched: the forward runs inside a batch's transaction (strategies._batch_one)
    settings = (
        {"batch_size": 10, "transaction_mode": TransactionMode.TRANSACTION_SCOPE}
        if batched
        else {}
    )
    endpoint, seen = recording_endpoint(database, **settings)
    endpoint.start()
    try:
        _insert_as_nservicebus(database, transport, text, body)
        if forwarded:
            received: list = []
            wait_for(lambda: received.extend(transport.receive("billing")) or received)
            [message] = received
            assert seen == []
            assert message.body == body and message.message_id == message_id
            assert message.headers == {
                headers.MESSAGE_ID: message_id,
                headers.CONTENT_TYPE: "text/plain",
            }
        else:
            wait_for(lambda: len(seen) == 1)
            _, got, carried = seen[0]
            assert got == body and FORWARD_DESTINATION not in carried
            assert carried[headers.MESSAGE_ID] == message_id
    finally:
        endpoint.stop(10)
    assert delayed_rows(database) == 0


def test_our_delayed_row_is_what_nservicebus_stores(database):
    transport = database.transport()
    transport.create_queue("billing")
    transport.create_delayed_table("sales")
    before = dt.datetime.now(dt.UTC)
    transport.send("billing", OutgoingMessage(b"body"), delay=30, endpoint="sales")
    table = transport.queues.delayed_table("sales")
    from sqlqueue_orm.models.delayed_table import delayed_table

    model = delayed_table(table.address.table, table.address.schema, database.engine)
    with database.engine.connect() as connection:
        [row] = connection.execute(sa.select(model.c.Headers, model.c.Body, model.c.Due)).all()
        assert 29 < (table.seconds_to_next_due(connection) or 0) <= 30.01
    stored = headers.deserialize(row.Headers)
    assert stored[FORWARD_DESTINATION] == transport.address_text("billing")
    deliver_at = headers.parse_time(stored["NServiceBus.DeliverAt"] or "")
    assert before + dt.timedelta(seconds=29) < deliver_at < before + dt.timedelta(seconds=32)
    assert row.Body == b"body"
    due = row.Due if isinstance(row.Due, dt.datetime) else dt.datetime.fromisoformat(row.Due)
    due = due.replace(tzinfo=dt.UTC) if due.tzinfo is None else due
    assert before + dt.timedelta(seconds=29) < due < before + dt.timedelta(seconds=32)


def test_delay_with_time_to_be_received_is_refused(database):
    transport = database.transport()
    transport.create_queue("sales")
    transport.create_delayed_table("sales")
    message = OutgoingMessage(b"x", time_to_be_received=60)
    with pytest.raises(exceptions.ConfigurationError, match="time_to_be_received"):
        transport.send("sales", message, delay=5)
    with pytest.raises(exceptions.ConfigurationError, match="not both"):
        transport.send("sales", OutgoingMessage(b"x"), delay=5, deliver_at=dt.datetime.now())
    with pytest.raises(exceptions.ConfigurationError, match="delay"):
        transport.send("sales", OutgoingMessage(b"x"), delay=-1)
    assert delayed_rows(database) == 0


def test_a_handler_defers_a_message_to_its_endpoint(database):
    endpoint, seen = recording_endpoint(database)
    deferred_at: list[float] = []

    @endpoint.handle_raw
    def defer(body: bytes, context: HandlerContext) -> None:
        if body == b"first":
            deferred_at.append(time.monotonic())
            context.defer(b"second", delay=0.5)

    endpoint.start()
    try:
        endpoint.send("sales", b"first")
        wait_for(lambda: len(seen) == 2)
    finally:
        endpoint.stop(10)
    assert [body for _, body, _ in seen] == [b"first", b"second"]
    assert seen[1][0] >= deferred_at[0] + 0.5 - CLOCK_GRAIN
    assert seen[1][2][headers.MESSAGE_INTENT] == "Send"


def test_a_handler_that_always_fails_goes_through_delayed_retries_to_the_error_queue(database):
    endpoint = Endpoint(
        "sales",
        database.transport(),
        peek_delay=0.1,
        immediate_retries=1,
        delayed_retries=2,
        delayed_retry_increase=0.3,
    )
    tries: list[tuple[float, dict[str, str | None]]] = []
    handled: list[bytes] = []

    @endpoint.handle_raw
    def handler(body: bytes, context: HandlerContext) -> None:
        if body == b"poisoned":
            tries.append((time.monotonic(), dict(context.headers)))
            raise RuntimeError("always fails")
        handled.append(body)

    transport = endpoint.transport
    body = b"poisoned"
    endpoint.start()
    try:
        message_id = endpoint.send("sales", body)
        for number in range(3):
            endpoint.send("sales", f"behind {number}".encode())
        wait_for(lambda: len(handled) == 3)  # not blocked behind the failing one
        errors: list = []
        wait_for(lambda: errors.extend(transport.receive("error")) or errors)
        stats = endpoint.stats
        # each attempt counted once: 3 immediate retries, 2 delayed, 1 move to the error queue
        assert (stats.retried, stats.delayed, stats.failed) == (3, 2, 1)
    finally:
        endpoint.stop(10)
    assert len(tries) == (1 + 1) * (1 + 2)  # first try + 1 immediate, then twice more
    counts = [carried.get(retries.RETRIES) for _, carried in tries]
    assert counts == [None, None, "1", "1", "2", "2"]
    # the n-th delayed retry waited n * 0.3 s
    assert tries[2][0] - tries[1][0] >= 0.3 - CLOCK_GRAIN
    assert tries[4][0] - tries[3][0] >= 0.6 - CLOCK_GRAIN
    [failed] = errors
    assert failed.body == body and failed.message_id == message_id
    assert failed.headers[retries.RETRIES] == "2"
    stamp = headers.parse_time(failed.headers[retries.RETRIES_TIMESTAMP] or "")
    assert abs((dt.datetime.now(dt.UTC) - stamp).total_seconds()) < 60
    assert failed.headers[headers.FAILED_QUEUE] == endpoint.address_text
    assert FORWARD_DESTINATION not in failed.headers
    assert delayed_rows(database) == 0


def test_the_delayed_retry_count_travels_in_the_message(database):
    """A message that already had its delayed retries (say, before a restart) gets no more."""
    endpoint = Endpoint(
        "sales", database.transport(), peek_delay=0.1, immediate_retries=1, delayed_retries=2
    )
    tries: list[int] = []

    @endpoint.handle_raw
    def handler(body: bytes, context: HandlerContext) -> None:
        tries.append(1)
        raise RuntimeError("fails")

    endpoint.start()
    try:
        endpoint.send("sales", OutgoingMessage(b"x", headers={retries.RETRIES: "2"}))
        errors: list = []
        wait_for(lambda: errors.extend(endpoint.transport.receive("error")) or errors)
    finally:
        endpoint.stop(10)
    assert len(tries) == 2  # the first try and one immediate retry; no delayed retry left
    assert delayed_rows(database) == 0


def test_delayed_retries_switched_off(database):
    endpoint = Endpoint(
        "sales", database.transport(), peek_delay=0.1, immediate_retries=0, delayed_retries=0
    )
    tries: list[int] = []

    @endpoint.handle_raw
    def handler(body: bytes, context: HandlerContext) -> None:
        tries.append(1)
        raise RuntimeError("fails")

    endpoint.start()
    try:
        endpoint.send("sales", b"x")
        errors: list = []
        wait_for(lambda: errors.extend(endpoint.transport.receive("error")) or errors)
    finally:
        endpoint.stop(10)
    assert len(tries) == 1
    assert retries.RETRIES not in errors[0].headers


def test_cli_lists_the_delayed_messages(database):
    from tests.integration.test_cli import sqlqueue

    transport = database.transport()
    transport.create_queue("billing")
    transport.create_delayed_table("sales")
    transport.create_delayed_table("orders")
    before = dt.datetime.now(dt.UTC)
    first = transport.send("billing", OutgoingMessage(b"hi"), delay=60, endpoint="sales")
    second = transport.send("orders", OutgoingMessage(b"\xff"), delay=30)
    lines = sqlqueue(database.url, "delayed", "list").stdout.splitlines()
    assert [line.split("\t")[1:] for line in lines] == [
        [transport.address_text("orders"), second, str(transport.queues.delayed_address("orders"))],
        [transport.address_text("billing"), first, str(transport.queues.delayed_address("sales"))],
    ]
    output = sqlqueue(database.url, "delayed", "list", "--json", "--endpoint", "sales").stdout
    [record] = [json.loads(line) for line in output.splitlines()]
    assert record["message_id"] == first and record["body"] == "hi"
    assert record["destination"] == transport.address_text("billing")
    due = dt.datetime.fromisoformat(record["due"])
    assert 60 - CLOCK_GRAIN <= (due - before).total_seconds() < 65
    missing = sqlqueue(database.url, "delayed", "list", "--endpoint", "nope", check=False)
    assert missing.returncode == 2 and "nope" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_the_mover_raises_the_critical_error_and_recovers(database):
    critical: list[tuple[str, BaseException]] = []
    endpoint = Endpoint(
        "sales",
        database.transport(),
        peek_delay=0.1,
        critical_error_after=0.3,
        initial_backoff=0.05,
        max_backoff=0.1,
        on_critical_error=lambda description, error: critical.append((description, error)),
    )
    seen: list[bytes] = []
    endpoint.handle_raw(lambda body, context: seen.append(body))
    transport = endpoint.transport
    table = table_sql(transport, transport.queues.delayed_address("sales"))
    endpoint.start()
    try:
        with database.engine.begin() as connection:
            connection.exec_driver_sql(f"DROP TABLE {table}")
        wait_for(lambda: bool(critical))
        transport.create_delayed_table("sales")
        endpoint.send("sales", b"after", delay=0.1)
        wait_for(lambda: seen == [b"after"])
    finally:
        endpoint.stop(10)
    description, _ = critical[0]
    assert description.startswith("Failed to move matured delayed messages to input queue")


def test_a_delayed_retry_returns_to_the_instance_queue_it_failed_in(database):
    endpoint = Endpoint(
        "sales",
        database.transport(),
        peek_delay=0.1,
        instance_name="blue",
        immediate_retries=0,
        delayed_retries=1,
        delayed_retry_increase=0.2,
    )
    tries: list[str] = []

    @endpoint.handle_raw
    def handler(body: bytes, context: HandlerContext) -> None:
        tries.append(str(context.message.queue))
        raise RuntimeError("fails")

    transport = endpoint.transport
    instance = endpoint.instance_address
    assert instance is not None
    endpoint.start()
    try:
        transport.send(instance, OutgoingMessage(b"for blue"))
        errors: list = []
        wait_for(lambda: errors.extend(transport.receive("error")) or errors)
    finally:
        endpoint.stop(10)
    assert tries == [str(instance), str(instance)]  # the retry came back to blue's queue
    assert errors[0].headers[retries.RETRIES] == "1"
    assert errors[0].headers[headers.FAILED_QUEUE] == transport.address_text(instance)
