"""What a publish sends: one message, the same for every subscriber, and the topics it reaches.

NServiceBus turns a publish into one unicast operation per subscriber address, every copy the
same message (``MulticastToUnicastConverter``): one ``NServiceBus.MessageId``, one
``TimeSent``, ``NServiceBus.MessageIntent: Publish``. A pydantic event carries its type and base
types in ``NServiceBus.EnclosedMessageTypes`` (as NServiceBus writes the message hierarchy), so a
subscriber that handles only a base type finds its handler.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlqueue_orm import addressing, exceptions, headers
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.pubsub import topics as topic_names

#: ``NServiceBus.MessageIntent`` of a published event.
PUBLISH = "Publish"


def prepare(
    event: OutgoingMessage | Any,
    type_names: Mapping[type[Any], str] | None = None,
    topics: Sequence[str] | None = None,
) -> tuple[OutgoingMessage, list[str]]:
    """The message every subscriber gets, and the topics whose subscribers get it.

    :param event: a pydantic model, or an :class:`OutgoingMessage` (of a model, or of bytes or
        text whose ``EnclosedMessageTypes`` header names the type).
    :param type_names: .NET names of models (topics and ``EnclosedMessageTypes``).
    :param topics: the topics to publish on, instead of the event type's hierarchy.
    :raises ConfigurationError: no topic can be told (bytes without EnclosedMessageTypes).
    """
    outgoing = event if isinstance(event, OutgoingMessage) else OutgoingMessage(event)
    body = outgoing.body
    model = type(body) if hasattr(body, "model_dump_json") else None
    if topics is not None:
        chosen = [topic_names.check_topic(topic) for topic in topics]
    elif model is not None:
        chosen = topic_names.topics_of(model, type_names)
    else:
        chosen = topic_names.topics_of_headers(outgoing.headers)
    if not chosen:
        raise exceptions.ConfigurationError(
            f"cannot publish {event!r}: publish a pydantic model, or give topics= or an "
            f"{headers.ENCLOSED_MESSAGE_TYPES} header naming the event type"
        )
    stamped = dict(outgoing.headers)
    stamped.setdefault(headers.MESSAGE_INTENT, PUBLISH)
    if model is not None:
        stamped.setdefault(
            headers.ENCLOSED_MESSAGE_TYPES,
            ";".join(topic_names.topics_of(model, type_names)),
        )
    stamped.setdefault(headers.TIME_SENT, headers.format_time(dt.datetime.now(dt.UTC)))
    message_id = outgoing.message_id or stamped.get(headers.MESSAGE_ID) or str(uuid.uuid4())
    stamped[headers.MESSAGE_ID] = message_id
    return dataclasses.replace(outgoing, headers=stamped, message_id=message_id), chosen


def one_per_table(
    addresses: Iterable[addressing.QueueAddress], default_schema: str | None
) -> list[addressing.QueueAddress]:
    """*addresses* with each table once, as first spelled.

    ``billing`` and ``billing@[dbo]`` / ``"public"."billing"`` (when that schema is the
    connection's default, *default_schema*) are one queue, subscribed under two spellings: a
    publish sends it one copy.
    """
    by_table: dict[addressing.QueueAddress, addressing.QueueAddress] = {}
    for address in addresses:
        same = address
        if address.schema is None and default_schema is not None:
            same = addressing.QueueAddress(address.table, default_schema, address.catalog)
        by_table.setdefault(same, address)
    return list(by_table.values())
