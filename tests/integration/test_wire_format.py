"""Wire format: headers as NServiceBus writes them, pydantic bodies, poison rows handed out raw.

Also the ORM model of a queue table.
"""

from __future__ import annotations

import uuid

import pydantic
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sqlqueue_orm import (
    OutgoingMessage,
    headers,
    queue_model,
)
from sqlqueue_orm.models.queue_table import queue_table
from tests.conftest import only
from tests.integration.support import bodies


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
    table = transport.queues.table_queue("norecover").quoted_table
    with database.engine.begin() as connection:
        connection.exec_driver_sql(f'ALTER TABLE {table} DROP COLUMN "Recoverable"')
    fresh = database.transport()  # a new process would probe the columns again
    fresh.send("norecover", OutgoingMessage(b"still works"))
    assert bodies(fresh.receive("norecover")) == [b"still works"]


