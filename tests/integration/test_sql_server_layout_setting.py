"""The SQL Server table layout setting: validated by name, and ignored by the other dialects."""

from __future__ import annotations

import pytest

from sqlqueue_orm import ConfigurationError, OutgoingMessage, Transport


def test_heap_layout_queues_work_on_every_dialect(database):
    transport = database.transport(sql_server_layout="heap")
    assert transport.create_queue("shared") is True
    transport.send("shared", OutgoingMessage(b"one"))
    transport.send("shared", OutgoingMessage(b"two"))
    assert [message.body for message in transport.receive("shared", 5)] == [b"one", b"two"]


def test_unknown_layout_is_refused_naming_it(database):
    with pytest.raises(ConfigurationError, match="'columnstore'"):
        Transport(database.engine, sql_server_layout="columnstore")
