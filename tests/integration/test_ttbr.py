"""TTBR: an expired message is never handed out as live; it is reported and purged."""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_table
from tests.integration.support import bodies


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
