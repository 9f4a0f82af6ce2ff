r"""The NServiceBus header wire format: a flat JSON object of strings, ``/`` written as ``\\/``.

.NET's DataContractJsonSerializer (transport 3.x to 7.x) writes ``/`` as ``\\/``, and 8.x keeps
doing so for compatibility, so we do too. Non-ASCII characters are written as themselves, as both
.NET serializers do. Reading accepts any valid JSON escaping.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping

from sqlqueue_orm import exceptions

MESSAGE_ID = "NServiceBus.MessageId"
CORRELATION_ID = "NServiceBus.CorrelationId"
CONVERSATION_ID = "NServiceBus.ConversationId"
TIME_SENT = "NServiceBus.TimeSent"
CONTENT_TYPE = "NServiceBus.ContentType"
ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
MESSAGE_INTENT = "NServiceBus.MessageIntent"
REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
ORIGINATING_ENDPOINT = "NServiceBus.OriginatingEndpoint"
ORIGINATING_MACHINE = "NServiceBus.OriginatingMachine"
PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
PROCESSING_ENDED = "NServiceBus.ProcessingEnded"
PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
FAILED_QUEUE = "NServiceBus.FailedQ"
TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
TIME_TO_BE_RECEIVED = "NServiceBus.TimeToBeReceived"

#: ``yyyy-MM-dd HH:mm:ss:ffffff Z``, NServiceBus's DateTimeExtensions.ToWireFormattedString.
_WIRE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f Z"


def format_time(moment: dt.datetime) -> str:
    """Format *moment* (naive means UTC) as an NServiceBus wire timestamp."""
    if moment.tzinfo is not None and moment.utcoffset():
        moment = moment.astimezone(dt.UTC)
    # Formatted by hand: strftime is the slowest part of preparing a send.
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}:{moment.microsecond:06d} Z"
    )


def parse_time(text: str) -> dt.datetime:
    """Parse an NServiceBus wire timestamp into an aware UTC datetime.

    :raises ValueError: naming *text* if it is not in the wire format.
    """
    try:
        parsed = dt.datetime.strptime(text.strip(), _WIRE_TIME_FORMAT)
    except ValueError:
        raise ValueError(f"not an NServiceBus timestamp: {text!r}") from None
    return parsed.replace(tzinfo=dt.UTC)


def format_timespan(seconds: float) -> str:
    """Format a duration as .NET ``TimeSpan.ToString()`` does (``[d.]hh:mm:ss[.fffffff]``)."""
    ticks = round(seconds * 10_000_000)
    days, ticks = divmod(ticks, 864_000_000_000)
    hours, ticks = divmod(ticks, 36_000_000_000)
    minutes, ticks = divmod(ticks, 600_000_000)
    whole, fraction = divmod(ticks, 10_000_000)
    text = f"{hours:02d}:{minutes:02d}:{whole:02d}"
    if days:
        text = f"{days}.{text}"
    if fraction:
        text += f".{fraction:07d}"
    return text


def serialize(headers: Mapping[str, str]) -> str:
    """Serialize *headers* to the wire format.

    :raises InvalidMessage: naming the header whose key or value is not a string.
    """
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise exceptions.InvalidMessage(
                f"header {key!r} has value {value!r}: header keys and values must be strings"
            )
    # "/" only ever appears inside JSON strings, so a plain replace is exact (RFC 8259 allows \/).
    return json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")


def deserialize(text: str) -> dict[str, str]:
    """Parse wire-format headers.

    :raises ValueError: describing why *text* is not a JSON object of strings.
    """
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"headers are a JSON {type(value).__name__}, not an object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise ValueError(f"header {key!r} has a non-string value {item!r}")
    return value
