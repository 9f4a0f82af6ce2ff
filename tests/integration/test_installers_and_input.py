"""Installers race safely; bad input is refused naming the value; legacy tables are warned about."""

from __future__ import annotations

import logging
import multiprocessing
import re

import pytest

from sqlqueue_orm import (
    ConfigurationError,
    OutgoingMessage,
    QueueNotFound,
)
from sqlqueue_orm.exceptions import InvalidMessage, InvalidQueueName
from sqlqueue_orm.models.queue_table import index_name
from sqlqueue_orm.sending.outbox import Outbox, OutboxOperation
from tests.integration import workers
from tests.integration.support import bodies


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
    table = transport.queues.table_queue("legacy").quoted_table
    with database.engine.begin() as connection:
        if database.dialect == "mssql":
            connection.exec_driver_sql(f"DROP INDEX [Index_Expires] ON {table}")
        else:
            connection.exec_driver_sql(f'DROP INDEX "{index_name("legacy", "Index_Expires")}"')
    with caplog.at_level(logging.WARNING, logger="sqlqueue_orm"):
        database.transport().send("legacy", OutgoingMessage(b"x"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("legacy" in line and "'Expires'" in line for line in warnings)


def test_concurrent_installers_create_one_table(database):
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        created = pool.starmap(workers.install, [(database.url, "raced")] * 4)
    assert created.count(True) == 1
    transport = database.transport()
    transport.send("raced", OutgoingMessage(b"ok"))
    assert bodies(transport.receive("raced")) == [b"ok"]


def test_a_lone_surrogate_in_a_header_is_refused_naming_the_header(database):
    transport = database.transport()
    transport.create_queue("strict")
    assert transport.create_subscription_table() is True
    transport.subscribe("strict", "Sales.OrderPlaced")
    outbox = Outbox(transport)
    outbox.create_table()
    bad_value = {"Custom.Note": "before\ud800after"}
    bad_key = {"Custom.\udc00": "x"}
    for given, named in ((bad_value, "Custom.Note"), (bad_key, "Custom.\\udc00")):
        for attempt in (
            lambda h=given: transport.send("strict", OutgoingMessage(b"x", headers=h)),
            lambda h=given: transport.send_many("strict", [OutgoingMessage(b"ok"),
                                                           OutgoingMessage(b"x", headers=h)]),
            lambda h=given: transport.publish(OutgoingMessage(b"x", headers=h),
                                              topics=["Sales.OrderPlaced"]),
            lambda h=given: OutboxOperation.from_prepared(
                "strict", OutgoingMessage(b"x", headers=h).prepare()),
        ):
            with pytest.raises(InvalidMessage, match=re.escape(named)) as refused:
                attempt()
            assert "surrogate" in str(refused.value)
    with pytest.raises(InvalidMessage, match="message id"):
        transport.send("strict", OutgoingMessage(b"x", message_id="id-\ud800"))
    with pytest.raises(InvalidMessage, match="message id"):  # the general way of prepare()
        transport.send("strict", OutgoingMessage(b"x", message_id="id-\ud800",
                                                 time_to_be_received=60))
    assert transport.peek("strict") == 0
    assert transport.receive("strict") == []
