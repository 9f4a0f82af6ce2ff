"""The queue conformance suite: every test runs on every available dialect."""

from __future__ import annotations

import logging
import multiprocessing
import time
import uuid

import pydantic
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqlqueue_orm import (
    ConfigurationError,
    OutgoingMessage,
    QueueAddress,
    QueueNotFound,
    headers,
    queue_model,
    queue_table,
)
from sqlqueue_orm.exceptions import InvalidMessage, InvalidQueueName
from sqlqueue_orm.models.queue_table import index_name
from tests.conftest import only
from tests.integration import workers


def bodies(messages):
    return [message.body for message in messages]


def test_fifo_order_single_and_batched(database):
    transport = database.transport()
    transport.create_queue("fifo")
    transport.send_many("fifo", [OutgoingMessage(f"m{i}") for i in range(30)])
    first = [transport.receive("fifo")[0].body for _ in range(5)]
    batch = transport.receive("fifo", max_messages=10)
    rest = transport.receive("fifo", max_messages=100)
    got = first + bodies(batch) + bodies(rest)
    assert got == [f"m{i}".encode() for i in range(30)]
    assert transport.receive("fifo") == []


def test_send_joins_the_callers_transaction_and_rollback_leaves_nothing(database):
    transport = database.transport()
    transport.create_queue("tx")
    with pytest.raises(RuntimeError), database.engine.begin() as connection:
        transport.send("tx", OutgoingMessage(b"lost"), connection=connection)
        transport.send_many("tx", [OutgoingMessage(b"a"), OutgoingMessage(b"b")], connection)
        raise RuntimeError("business rule failed")
    assert transport.peek("tx") == 0
    assert transport.receive("tx", 10) == []


def test_rolled_back_receive_puts_the_message_back_in_its_place(database):
    transport = database.transport()
    transport.create_queue("back")
    transport.send_many("back", [OutgoingMessage(name) for name in ("a", "b", "c")])
    connection = database.engine.connect()
    transaction = connection.begin()
    [taken] = transport.receive("back", connection=connection)
    assert taken.body == b"a"
    transaction.rollback()
    connection.close()
    again = transport.receive("back", 3)
    assert bodies(again) == [b"a", b"b", b"c"]
    assert again[0].id == taken.id and again[0].row_version == taken.row_version


def test_ttbr_expiry_reported_and_purged(database, caplog):
    transport = database.transport()
    transport.create_queue("ttl")
    transport.send("ttl", OutgoingMessage(b"short", time_to_be_received=0.3))
    transport.send("ttl", OutgoingMessage(b"long", time_to_be_received=3600))
    transport.send("ttl", OutgoingMessage(b"forever"))
    # Expires comes from the database clock, not ours.
    with database.engine.connect() as connection:
        table = queue_table("ttl", dialect=database.engine)
        expires = list(
            connection.scalars(sa.select(table.c.Expires).order_by(table.c.RowVersion))
        )
    assert expires[0] is not None and expires[1] is not None and expires[2] is None
    time.sleep(0.8)
    received = transport.receive("ttl", 3)
    assert [(m.body, m.expired) for m in received] == [
        (b"short", True),
        (b"long", False),
        (b"forever", False),
    ]
    transport.send_many(
        "ttl",
        [OutgoingMessage(f"e{i}", time_to_be_received=0.2) for i in range(25)]
        + [OutgoingMessage(f"live{i}") for i in range(5)],
    )
    time.sleep(0.6)
    with caplog.at_level(logging.INFO, logger="sqlqueue_orm"):
        assert transport.purge_expired("ttl", batch_size=10) == 25
    purge_lines = [r.getMessage() for r in caplog.records if "purged" in r.getMessage()]
    assert len(purge_lines) == 3 and all("queue ttl" in line for line in purge_lines)
    assert bodies(transport.receive("ttl", 10)) == [f"live{i}".encode() for i in range(5)]


def test_peek_estimates_from_row_versions(database):
    transport = database.transport()
    transport.create_queue("big")
    assert transport.peek("big") == 0
    total = 50_000
    with database.engine.begin() as connection:
        for _ in range(total // 5_000):
            batch = [OutgoingMessage(b"x") for _ in range(5_000)]
            transport.send_many("big", batch, connection=connection)
    assert transport.peek("big") == total
    transport.receive("big", 100)
    assert transport.peek("big") == total - 100
    with database.engine.begin() as connection:  # a hole in the middle: still an upper bound
        table = queue_table("big", dialect=database.engine)
        connection.execute(table.delete().where(table.c.RowVersion.between(1000, 1999)))
    assert transport.peek("big") == total - 100


def test_headers_on_the_wire(database):
    transport = database.transport()
    transport.create_queue("wire")
    message_id = transport.send(
        "wire",
        OutgoingMessage(b"b", headers={"NServiceBus.ReplyToAddress": "a/b@[c]", "ü": "ß"}),
    )
    with database.engine.connect() as connection:
        table = queue_table("wire", dialect=database.engine)
        raw = connection.execute(sa.select(table.c.Headers)).scalar_one()
    assert '"NServiceBus.ReplyToAddress":"a\\/b@[c]"' in raw
    assert '"ü":"ß"' in raw
    [message] = transport.receive("wire")
    assert message.headers["NServiceBus.ReplyToAddress"] == "a/b@[c]"
    assert message.message_id == message_id
    assert message.headers[headers.TIME_SENT].endswith(" Z")


class Invoice(pydantic.BaseModel):
    number: str
    amount: float


def test_pydantic_bodies(database):
    transport = database.transport()
    transport.create_queue("models")
    transport.send("models", OutgoingMessage(Invoice(number="İ-1", amount=9.5)))
    [message] = transport.receive("models")
    assert message.model(Invoice) == Invoice(number="İ-1", amount=9.5)
    assert message.headers[headers.CONTENT_TYPE] == "application/json"
    assert message.headers[headers.ENCLOSED_MESSAGE_TYPES].endswith(".Invoice")


def test_poison_headers_are_handed_out_not_lost(database):
    transport = database.transport()
    transport.create_queue("poison")
    model = queue_model("poison", dialect=database.engine)
    with Session(database.engine) as session, session.begin():
        session.add(model(id=uuid.uuid4(), recoverable=True, headers="{broken", body=b"raw"))
    [message] = transport.receive("poison")
    assert message.headers_error and message.raw_headers == "{broken" and message.body == b"raw"


def test_orm_model_reads_the_queue(database):
    transport = database.transport()
    transport.create_queue("orm")
    transport.send_many("orm", [OutgoingMessage(b"1"), OutgoingMessage(b"2")])
    model = queue_model("orm", dialect=database.engine)
    with Session(database.engine) as session:
        rows = session.scalars(sa.select(model).order_by(model.row_version)).all()
    assert [row.body for row in rows] == [b"1", b"2"]
    assert rows[0].row_version < rows[1].row_version and rows[0].recoverable is True


@only("sqlite", "mssql")  # PostgreSQL's layout (NServiceBus's) has no Recoverable column
def test_recoverable_column_dropped(database):
    transport = database.transport()
    transport.create_queue("norecover")
    table = transport.queue("norecover").quoted_table
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f'ALTER TABLE {table} DROP COLUMN "Recoverable"')
    fresh = database.transport()  # a new process would probe the columns again
    fresh.send("norecover", OutgoingMessage(b"still works"))
    assert bodies(fresh.receive("norecover")) == [b"still works"]


def test_bad_input_is_refused_with_the_value_named(database):
    transport = database.transport()
    transport.create_queue("strict")
    with pytest.raises(ValueError, match="0"):
        transport.receive("strict", max_messages=0)
    with pytest.raises(InvalidMessage, match="-5"):
        transport.send("strict", OutgoingMessage(b"x", time_to_be_received=-5))
    with pytest.raises(QueueNotFound, match="missing"):
        transport.send("missing", OutgoingMessage(b"x"))
    with pytest.raises(QueueNotFound, match="missing"):
        transport.receive("missing")
    with pytest.raises(ConfigurationError):
        transport.send("", OutgoingMessage(b"x"))
    if database.dialect == "postgresql":
        with pytest.raises(InvalidQueueName, match="x" * 64):
            transport.create_queue("x" * 64)
    assert transport.peek("strict") == 0


def test_schema_warnings_name_the_queue(database, caplog):
    transport = database.transport()
    transport.create_queue("legacy")
    table = transport.queue("legacy").quoted_table
    with database.engine.begin() as connection:
        if database.dialect == "mssql":
            connection.exec_driver_sql(f"DROP INDEX [Index_Expires] ON {table}")
        else:
            connection.exec_driver_sql(f'DROP INDEX "{index_name("legacy", "Index_Expires")}"')
    with caplog.at_level(logging.WARNING, logger="sqlqueue_orm"):
        database.transport().send("legacy", OutgoingMessage(b"x"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("legacy" in line and "'Expires'" in line for line in warnings)


HOSTILE = [
    "it's",
    'dou"ble',
    "br[ack]]et",
    "semi;colon",
    "dash -- comment",
    "drop table sentinel; --",
    "per%cent %s %(x)s",
    "colon :name ?",
    "ünïcödé ✉ 队列",
    "with space.and.dots",
    "Mixed Case",
    "a@b",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_queue_names_round_trip_and_never_run_as_sql(database, name):
    transport = database.transport()
    transport.create_queue("sentinel")
    address = QueueAddress(name)
    assert QueueAddress.parse(str(address)) == address
    assert transport.create_queue(address) is True
    assert transport.create_queue(address) is False
    transport.send(address, OutgoingMessage(name, time_to_be_received=60))
    transport.send(str(address), OutgoingMessage(b"second"))
    assert transport.peek(address) == 2
    assert bodies(transport.receive(address, 5)) == [name.encode(), b"second"]
    assert transport.purge_expired(address) == 0
    listed = dict(transport.list_queues())
    assert str(address) in listed and "sentinel" in listed
    assert transport.peek("sentinel") == 0  # the sentinel table still exists


def test_hostile_schema_names(database):
    if database.dialect == "sqlite":
        pytest.skip("SQLite schemas are ATTACHed database files; covered by the table-name tests")
    transport = database.transport()
    address = QueueAddress("q; drop", "sch]e'ma\"%")
    transport.create_queue(address)
    transport.send(address, OutgoingMessage(b"x"))
    assert bodies(transport.receive(str(address))) == [b"x"]
    assert [name for name, _ in transport.list_queues([address.schema])] == [str(address)]


def test_four_processes_drain_10000_messages_each_exactly_once(database):
    transport = database.transport()
    transport.create_queue("work")
    with database.engine.begin() as connection:
        for start in range(0, 10_000, 2_000):
            transport.send_many(
                "work",
                [OutgoingMessage(b"w", message_id=f"m{i}") for i in range(start, start + 2_000)],
                connection=connection,
            )
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        results = pool.starmap(workers.drain, [(database.url, "work", seed) for seed in range(4)])
    everything = [message_id for result in results for message_id in result]
    assert len(everything) == 10_000
    assert set(everything) == {f"m{i}" for i in range(10_000)}
    assert sum(1 for result in results if result) >= 2  # the work really was shared
    for result in results:  # each receiver saw FIFO order
        assert result == sorted(result, key=lambda m: int(m[1:]))


def test_concurrent_installers_create_one_table(database):
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        created = pool.starmap(workers.install, [(database.url, "raced")] * 4)
    assert created.count(True) == 1
    transport = database.transport()
    transport.send("raced", OutgoingMessage(b"ok"))
    assert bodies(transport.receive("raced")) == [b"ok"]
