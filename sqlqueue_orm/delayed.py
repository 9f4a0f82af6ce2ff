"""Delayed sends: when a message is due, and what it carries to its delayed table.

A delayed send (``Transport.send(..., delay=...)``) stores the message in a delayed table
(:class:`~sqlqueue_orm.queuing.delayed_table.DelayedTable`) with the header naming where it goes;
the endpoint's mover brings it there once due. This module holds the parts of that which need no
database: the due time of a ``delay`` or ``deliver_at`` (:func:`due_ms`) and the rows a delayed
send stores (:func:`prepare`). What waits is read by :mod:`sqlqueue_orm.browsing`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from sqlqueue_orm import exceptions, headers
from sqlqueue_orm.messages import OutgoingMessage, PreparedMessage
from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION

#: The longest delay accepted, in seconds (100 years): a longer one is a mistake.
MAX_DELAY_SECONDS = 100 * 365 * 86400


def due_ms(delay: dt.timedelta | float | None, deliver_at: dt.datetime | None) -> int | None:
    """Milliseconds until a delayed message is due (None: not delayed).

    :raises ConfigurationError: both given, a negative or too long delay, or a *deliver_at*
        that is not a datetime (naive means UTC).
    """
    if delay is not None and deliver_at is not None:
        raise exceptions.ConfigurationError("give delay or deliver_at, not both")
    if deliver_at is not None:
        if not isinstance(deliver_at, dt.datetime):
            raise exceptions.ConfigurationError(f"deliver_at {deliver_at!r} is not a datetime")
        moment = deliver_at if deliver_at.tzinfo else deliver_at.replace(tzinfo=dt.UTC)
        return max(0, round((moment - dt.datetime.now(dt.UTC)).total_seconds() * 1000))
    if delay is None:
        return None
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise exceptions.ConfigurationError(
            f"delay {delay!r} must be a non-negative number of seconds or a timedelta"
        )
    if seconds > MAX_DELAY_SECONDS:
        raise exceptions.ConfigurationError(f"delay {delay!r} is longer than 100 years")
    return round(seconds * 1000)


def prepare(
    messages: Sequence[OutgoingMessage], forward: str, due_in_ms: int
) -> list[PreparedMessage]:
    """The rows of *messages* for a delayed table, each naming *forward* as its destination.

    Each carries NServiceBus Core's ``DeliverAt`` header (critical time counts from it), by this
    clock, unless it sets one itself.

    :raises ConfigurationError: a message with a time_to_be_received (NServiceBus refuses a
        delayed message with one).
    """
    deliver_at = headers.format_time(
        dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=due_in_ms)
    )
    prepared = []
    for message in messages:
        if message.time_to_be_received is not None:
            raise exceptions.ConfigurationError(
                f"message {message.message_id or ''} to {forward}: a delayed message cannot "
                "have a time_to_be_received too (NServiceBus refuses the combination)"
            )
        carried = {**message.headers, FORWARD_DESTINATION: forward}
        carried.setdefault(headers.DELIVER_AT, deliver_at)
        prepared.append(dataclasses.replace(message, headers=carried).prepare())
    return prepared
