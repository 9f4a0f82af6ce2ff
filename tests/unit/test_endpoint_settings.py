"""EndpointSettings: bad values refused by name, odd ones warned, NServiceBus's defaults."""

from __future__ import annotations

import logging
import os

import pytest

from sqlqueue_orm import exceptions
from sqlqueue_orm.receiving import EndpointSettings, TransactionMode


def test_defaults_are_nservicebus_defaults():
    settings = EndpointSettings()
    assert settings.concurrency == max(os.cpu_count() or 1, 2)
    assert settings.peek_delay == 1.0
    assert settings.immediate_retries == 5
    assert settings.shutdown_timeout == 30.0
    assert settings.critical_error_after == 30.0
    assert settings.transaction_mode is TransactionMode.TRANSACTION_SCOPE
    assert settings.instance_name is None
    assert settings.instance_concurrency == 1


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"peek_delay": 0.05}, "peek_delay 0.05 is below 0.1 seconds"),
        ({"peek_delay": float("nan")}, "peek_delay nan"),
        ({"concurrency": 0}, "concurrency 0"),
        ({"concurrency": True}, "concurrency True"),
        ({"peek_batch_size": 0}, "peek_batch_size 0"),
        ({"transaction_mode": "sometimes"}, "transaction_mode 'sometimes'"),
        ({"error_queue": " "}, "error_queue ' '"),
        ({"max_backoff": 0.01}, "max_backoff 0.01 is below initial_backoff"),
        ({"shutdown_timeout": -1}, "shutdown_timeout -1"),
        ({"instance_name": " "}, "instance_name ' '"),
        ({"instance_concurrency": 0}, "instance_concurrency 0"),
        ({"wakeup": "listen"}, "wakeup 'listen' must be one of auto, poll"),
        ({"wakeup": "poll", "notify": True}, "notify=True listens for NOTIFY"),
        ({"notify": "yes"}, "notify 'yes' must be None"),
        ({"notify": 1}, "notify 1 must be None"),
        ({"burst_delay": 0.001}, "burst_delay 0.001 must be from 0.005"),
        ({"burst_delay": 2.0}, r"burst_delay 2.0 must be .* to peek_delay \(1.0\)"),
        ({"burst_window": -1}, "burst_window -1"),
        ({"unanswered_after": 0.1}, "unanswered_after 0.1 must be at least 0.5 seconds"),
        ({"unanswered_after": "3"}, "unanswered_after '3' is not a finite number"),
    ],
)
def test_bad_values_are_refused_by_name(changes, named):
    with pytest.raises(exceptions.ConfigurationError, match=named):
        EndpointSettings(**changes)


def test_a_long_peek_delay_is_warned(caplog):
    with caplog.at_level(logging.WARNING):
        EndpointSettings(peek_delay=11)
    assert "peek_delay 11s is above 10 seconds" in caplog.text


def test_a_mode_may_be_named_by_its_value():
    assert EndpointSettings(transaction_mode="none").transaction_mode is TransactionMode.NONE


def test_the_wakeup_is_on_where_possible_by_default():
    assert EndpointSettings().notify is None
