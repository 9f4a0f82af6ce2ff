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


def test_a_rolled_back_batch_receive_puts_every_message_back_in_its_place_in_order(database):
    transport = database.transport()
    transport.create_queue("batch back")
    transport.send_many("batch back", [OutgoingMessage(name) for name in "abcde"])
    before = transport.browse("batch back", 5)
    with database.engine.connect() as connection:
        transaction = connection.begin()
        taken = transport.receive("batch back", 3, connection=connection)
        assert bodies(taken) == [b"a", b"b", b"c"]
        transaction.rollback()
    again = transport.receive("batch back", 5)
    assert bodies(again) == [b"a", b"b", b"c", b"d", b"e"]
    assert [(m.id, m.row_version) for m in again[:3]] == [(m.id, m.row_version) for m in taken]
    assert [(m.id, m.row_version) for m in again] == [(m.id, m.row_version) for m in before]
