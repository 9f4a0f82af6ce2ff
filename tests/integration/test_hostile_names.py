"""Hostile names: any queue or schema name round-trips, quoted by SQLAlchemy, never run as SQL."""

from __future__ import annotations

import pytest

from sqlqueue_orm import OutgoingMessage, QueueAddress
from tests.integration.support import bodies

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
