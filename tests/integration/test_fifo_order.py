"""FIFO: messages come out in the order they were sent, one at a time or in batches.

Peek estimates what waits.
"""

from __future__ import annotations

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_table
from tests.integration.support import bodies


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
