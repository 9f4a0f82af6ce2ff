"""A row whose Id, Body or Expires is not what the table declares is handed out raw, once.

SQLite stores whatever a writer gives it, whatever the column's declared type. Such a row comes
out of a receive, a browse and an endpoint like a row whose headers cannot be read: once, with
``headers_error`` naming the column and ``stored_values`` holding what is stored, and no other
row of the batch is lost or held back. An endpoint moves it to the error queue as stored.
(PostgreSQL's and SQL Server's column types hold only values of their type; their unreadable
headers are covered by ``test_unreadable_headers``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, queue_model
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, TransactionMode
from tests.conftest import only
from tests.integration.test_endpoint_transaction_modes import run_until
from tests.integration.test_unreadable_headers import PATHS, receive

GOOD_HEADERS = '{"NServiceBus.MessageId":"hostile"}'

BAD_IDS = ["not-a-uuid", "", "   ", 12345, b"0123456789abcdef"]
BAD_BODIES = ["hello", 1.5, -1, 10**18, 5]
BAD_EXPIRES = ["", 12345, "not a date", 1.5, b"\x00\x01"]


def insert_stored(engine, queue, **values):  # type: ignore[no-untyped-def]
    """Insert one row holding *values* (no conversion on the way); return what is stored.

    SQLite applies the column's affinity: an INTEGER given to the CHAR(32) Id is stored as
    text, a numeric text given to the DATETIME Expires as a number.
    """
    row = {"Id": uuid.uuid4().hex, "Recoverable": 1, "Expires": None,
           "Headers": GOOD_HEADERS, "Body": b"hostile", **values}
    table = sa.table(queue, *(sa.column(name) for name in [*row, "RowVersion"]))
    with engine.begin() as connection:
        connection.execute(sa.insert(table).values(row))
        stored = connection.execute(
            sa.select(*(table.c[name] for name in values)).order_by(
                table.c.RowVersion.desc()).limit(1)
        ).one()
    return dict(zip(values, stored, strict=True))


def between_good_rows(database, queue, **values):  # type: ignore[no-untyped-def]
    """A good message, the stored row, a good message; the two good ids, what is stored."""
    transport = database.transport()
    transport.create_queue(queue)
    first = transport.send(queue, OutgoingMessage(b"first"))
    stored = insert_stored(database.engine, queue, **values)
    last = transport.send(queue, OutgoingMessage(b"last"))
    return transport, first, last, stored


def assert_hostile_between(messages, first, last, column, value):  # type: ignore[no-untyped-def]
    assert [message.message_id for message in messages][::2] == [first, last]
    assert [message.body for message in messages][::2] == [b"first", b"last"]
    hostile = messages[1]
    assert hostile.headers_error is not None and column in hostile.headers_error
    assert hostile.stored_values is not None and hostile.stored_values[column] == value
    assert not hostile.expired
    assert hostile.raw_headers == GOOD_HEADERS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
@only("sqlite")
def test_an_id_that_is_not_a_uuid_comes_out_raw_with_its_batch(database, value, path):
    transport, first, last, stored = between_good_rows(database, "ids", Id=value)
    messages = receive(database, transport, "ids", path, max_messages=10)
    assert_hostile_between(messages, first, last, "Id", stored["Id"])
    assert messages[1].body == b"hostile"
    assert transport.receive("ids", 10) == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", BAD_BODIES, ids=repr)
@only("sqlite")
def test_a_body_that_is_not_bytes_comes_out_raw_with_its_batch(database, value, path):
    transport, first, last, stored = between_good_rows(database, "bodies", Body=value)
    messages = receive(database, transport, "bodies", path, max_messages=10)
    assert_hostile_between(messages, first, last, "Body", stored["Body"])
    assert messages[1].body is None  # never a made-up body (an INTEGER 5 is not 5 zero bytes)
    assert transport.receive("bodies", 10) == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", BAD_EXPIRES, ids=repr)
@only("sqlite")
def test_an_expires_that_is_not_a_date_is_not_expired_but_comes_out_raw(database, value, path):
    transport, first, last, stored = between_good_rows(database, "expires", Expires=value)
    messages = receive(database, transport, "expires", path, max_messages=10)
    assert_hostile_between(messages, first, last, "Expires", stored["Expires"])
    assert messages[1].body == b"hostile"
    assert transport.receive("expires", 10) == []


@only("sqlite")
def test_purge_expired_keeps_a_row_whose_expires_is_not_a_date(database):
    transport = database.transport()
    transport.create_queue("purge")
    for value in BAD_EXPIRES:
        insert_stored(database.engine, "purge", Expires=value)
    insert_stored(database.engine, "purge", Expires="2000-01-01 00:00:00.000")
    assert transport.purge_expired("purge") == 1
    assert len(transport.browse("purge", 100)) == len(BAD_EXPIRES)


@only("sqlite")
def test_a_date_in_the_past_is_still_expired(database):
    transport = database.transport()
    transport.create_queue("past")
    insert_stored(database.engine, "past", Expires="2000-01-01 00:00:00.000")
    insert_stored(database.engine, "past", Expires="2000-01-01")
    insert_stored(database.engine, "past", Expires="2999-01-01 00:00:00.000")
    messages = transport.receive("past", 10)
    assert [message.expired for message in messages] == [True, True, False]
    assert [message.headers_error for message in messages] == [None, None, None]


@only("sqlite")
def test_browse_shows_every_row_raw_and_takes_nothing(database):
    transport = database.transport()
    transport.create_queue("browsed")
    first = transport.send("browsed", OutgoingMessage(b"first"))
    stored = [
        insert_stored(database.engine, "browsed", **values)
        for values in ({"Id": BAD_IDS[0]}, {"Body": BAD_BODIES[0]}, {"Expires": BAD_EXPIRES[0]})
    ]
    last = transport.send("browsed", OutgoingMessage(b"last"))
    messages = transport.browse("browsed", 10)
    assert messages[0].message_id == first and messages[0].headers_error is None
    assert messages[-1].message_id == last and messages[-1].headers_error is None
    for message, values in zip(messages[1:4], stored, strict=True):
        [(column, value)] = values.items()
        assert message.headers_error is not None and column in message.headers_error
        assert message.stored_values is not None and message.stored_values[column] == value
        assert not message.expired
    assert len(transport.browse("browsed", 10)) == 5


@pytest.mark.parametrize(
    "mode", [TransactionMode.TRANSACTION_SCOPE, TransactionMode.NONE], ids=lambda m: m.name
)
@only("sqlite")
def test_an_endpoint_moves_the_rows_to_the_error_queue_as_stored_and_handles_the_rest(
    database, mode
):
    transport = database.transport()
    transport.create_queue("inbox")
    good = [transport.send("inbox", OutgoingMessage(b"first"))]
    stored = [
        insert_stored(database.engine, "inbox", **values)
        for values in ({"Id": BAD_IDS[0]}, {"Body": BAD_BODIES[0]}, {"Expires": BAD_EXPIRES[0]},
                       {"Body": 5}, {"Id": 12345, "Body": "text"})
    ]
    good.append(transport.send("inbox", OutgoingMessage(b"last")))
    handled: list[str] = []
    settings = EndpointSettings(concurrency=1, transaction_mode=mode, peek_delay=0.1)
    endpoint = Endpoint("inbox", transport, settings=settings)
    endpoint.handle_raw(lambda body, context: handled.append(context.message_id))

    def done() -> bool:
        stats = endpoint.stats
        return stats.handled + stats.failed + stats.expired + stats.poison >= 7

    run_until(endpoint, done)
    assert handled == good
    assert endpoint.stats.poison == len(stored) and endpoint.stats.failed == 0
    assert transport.peek("inbox") == 0
    table = sa.table("error", sa.column("Id"), sa.column("Expires"), sa.column("Body"),
                     sa.column("Headers"))
    with database.engine.connect() as connection:
        rows = connection.execute(sa.select(table).order_by(sa.literal_column("RowVersion")))
        moved = [dict(row._mapping) for row in rows]
    assert len(moved) == len(stored)
    for row, values in zip(moved, stored, strict=True):
        for column, value in values.items():
            if column != "Expires":  # the error queue's copy never expires
                assert row[column] == value, (row, values)
        assert row["Headers"] == GOOD_HEADERS
    env = {**os.environ, "SQLQUEUE_URL": database.url}
    for command in (["errors", "list"], ["errors", "groups"]):  # the error queue reads them
        result = subprocess.run(
            [sys.executable, "-m", "sqlqueue_orm.cli", *command], capture_output=True,
            text=True, env=env, timeout=120, check=False,
        )
        assert result.returncode == 0 and result.stderr == "", result.stderr
    assert transport.browse("error", 10)[0].stored_values == stored[0]


@only("sqlite")
def test_the_cli_lists_and_receives_one_line_per_row(database):
    transport, _, _, _ = between_good_rows(database, "listed", Id="not-a-uuid")
    insert_stored(database.engine, "listed", Body="text", Expires="")
    env = {**os.environ, "SQLQUEUE_URL": database.url}
    for command in (["browse", "listed"], ["receive", "listed", "--count", "10"]):
        result = subprocess.run(
            [sys.executable, "-m", "sqlqueue_orm.cli", *command], capture_output=True,
            text=True, env=env, timeout=120, check=False,
        )
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.strip().splitlines()) == 4, result.stdout
        assert "bug" not in result.stderr
    assert transport.peek("listed") == 0


@only("sqlite")
@pytest.mark.parametrize("path", PATHS)
def test_text_that_is_not_utf8_in_id_body_or_expires_loses_nothing(database, path):
    # The sqlite3 driver fails a whole fetch on such text: the batch would go with it.
    transport = database.transport()
    transport.create_queue("latin1")
    first = transport.send("latin1", OutgoingMessage(b"first"))
    table = sa.table("latin1", *(sa.column(name) for name in
                                 ("Id", "Recoverable", "Expires", "Headers", "Body")))
    undecodable = sa.cast(sa.literal(b"caf\xe9", sa.LargeBinary()), sa.Text())
    with database.engine.begin() as connection:
        for column in ("Id", "Body", "Expires"):
            row = {"Id": uuid.uuid4().hex, "Recoverable": 1, "Expires": None,
                   "Headers": GOOD_HEADERS, "Body": b"hostile", column: undecodable}
            connection.execute(sa.insert(table).values(row))
    last = transport.send("latin1", OutgoingMessage(b"last"))
    for messages in (transport.browse("latin1", 10),
                     receive(database, transport, "latin1", path, max_messages=10)):
        assert [message.message_id for message in messages][::4] == [first, last]
        for message, column in zip(messages[1:4], ("Id", "Body", "Expires"), strict=True):
            assert message.headers_error is not None and column in message.headers_error
            assert message.stored_values == {column: b"caf\xe9"}
            assert not message.expired
    assert transport.receive("latin1", 10) == []


@only("postgresql")
def test_postgresql_browse_reads_an_expiry_python_cannot_hold(database):
    # infinity, or a year past 9999: PostgreSQL holds them, Python's datetime does not
    transport = database.transport()
    transport.create_queue("far")
    model = queue_model("far", dialect=database.engine)
    with database.engine.begin() as connection:
        for when in ("'infinity'::timestamp", "'-infinity'::timestamp", "'20000-01-01'::timestamp"):
            connection.execute(sa.insert(model).values(
                id=uuid.uuid4(), headers="{}", body=b"far", expires=sa.literal_column(when)))
    browsed = transport.browse("far", 10)
    assert [message.expired for message in browsed] == [False, True, False]
    assert [message.headers_error for message in browsed] == [None, None, None]
    received = transport.receive("far", 10)
    assert [message.expired for message in received] == [False, True, False]
