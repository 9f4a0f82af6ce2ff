"""Rollback: a rolled-back send leaves nothing; a rolled-back receive puts the message back."""

from __future__ import annotations

import pytest

from sqlqueue_orm import (
    OutgoingMessage,
)
from tests.integration.support import bodies


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
