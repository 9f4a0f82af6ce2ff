"""What ``OutboxData`` holds: the operations of a record and their JSON, records, reports.

``Operations`` is a JSON array in the shape of NServiceBus SQL persistence's
``SerializableOperation`` (Newtonsoft serializes ``byte[]`` as base64)::

    [{"MessageId": "9f0c...",                                 # NServiceBus.MessageId
      "Options": {"Destination": "billing@[dbo]",             # queue address
                  "TimeToBeReceived": "00:05:00"},            # .NET TimeSpan, only with a TTBR
      "Headers": {"NServiceBus.MessageId": "9f0c...", ...},   # every header, as sent
      "Body": "eyJvcmRlciI6IDQyfQ=="}]                        # base64, or null for no body
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import datetime as dt
import importlib.metadata
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from sqlqueue_orm import addressing, headers
from sqlqueue_orm.messages import PreparedMessage


def _persistence_version() -> str:
    try:
        version = importlib.metadata.version("sqlqueue_orm")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    return f"sqlqueue_orm {version}"[:23]


#: Written to ``PersistenceVersion`` (varchar(23)), as NServiceBus writes its own version.
PERSISTENCE_VERSION = _persistence_version()

#: Option keys NServiceBus Core uses in outbox operations (``DispatchProperties``).
DESTINATION = "Destination"
TIME_TO_BE_RECEIVED = "TimeToBeReceived"


def utc_now() -> dt.datetime:
    """Now, as the naive UTC datetime ``DispatchedAt`` holds."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)

_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?$")


def parse_timespan(text: str) -> float:
    """Parse a .NET ``TimeSpan`` (``[d.]hh:mm:ss[.fffffff]``) into seconds.

    :raises ValueError: naming *text* when it is not in that form.
    """
    match = _TIMESPAN.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a TimeSpan: {text!r}")
    days, hours, minutes, seconds, fraction = match.groups()
    total = int(days or 0) * 86_400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    return total + (int(fraction.ljust(7, "0")) / 10_000_000 if fraction else 0.0)


@dataclasses.dataclass(frozen=True)
class OutboxOperation:
    """One message stored in an outbox record, waiting to be sent to its destination."""

    message_id: str
    headers: dict[str, str | None]
    body: bytes | None
    options: dict[str, str]

    @property
    def destination(self) -> str:
        """The queue address the message goes to (``Options.Destination``)."""
        return self.options[DESTINATION]

    @property
    def ttbr_ms(self) -> int | None:
        """The time to be received in milliseconds, if any (``Options.TimeToBeReceived``)."""
        value = self.options.get(TIME_TO_BE_RECEIVED)
        if value is None:
            return None
        return max(1, round(parse_timespan(value) * 1000))

    @classmethod
    def from_prepared(cls, destination: str, message: PreparedMessage) -> OutboxOperation:
        """The operation sending *message* (already validated by ``prepare()``) to *destination*."""
        options = {DESTINATION: destination}
        if message.ttbr_ms is not None:
            options[TIME_TO_BE_RECEIVED] = headers.format_timespan(message.ttbr_ms / 1000)
        return cls(message.message_id, headers.deserialize(message.headers), message.body, options)

    def prepare(self) -> PreparedMessage:
        """The queue row to insert: a new native id, the stored message id, headers and body.

        The TTBR counts from this send, as it does when NServiceBus dispatches its outbox.
        """
        return PreparedMessage(
            uuid.uuid4(), self.message_id, headers.serialize(self.headers), self.body, self.ttbr_ms
        )

    def to_json(self) -> dict[str, Any]:
        """Return this operation as NServiceBus's ``SerializableOperation`` JSON object."""
        return {
            "MessageId": self.message_id,
            "Options": dict(self.options),
            "Headers": dict(self.headers),
            "Body": None if self.body is None else base64.b64encode(self.body).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: Any) -> OutboxOperation:
        """Read one ``SerializableOperation`` object.

        :raises ValueError: saying what is wrong with *data*.
        """
        if not isinstance(data, dict):
            raise ValueError(f"an operation is a JSON {type(data).__name__}, not an object")
        message_id = data.get("MessageId")
        if not isinstance(message_id, str) or not message_id:
            raise ValueError(f"operation MessageId {message_id!r} is not a non-empty string")
        options, message_headers = data.get("Options") or {}, data.get("Headers") or {}
        if not isinstance(options, dict) or not all(
            isinstance(key, str) and isinstance(item, str) for key, item in options.items()
        ):
            raise ValueError(f"operation {message_id}: Options is not an object of strings")
        # Header values may be null, as NServiceBus's Dictionary<string, string> writes them.
        if not isinstance(message_headers, dict) or not all(
            isinstance(key, str) and (item is None or isinstance(item, str))
            for key, item in message_headers.items()
        ):
            raise ValueError(
                f"operation {message_id}: Headers is not an object of strings and nulls"
            )
        destination = options.get(DESTINATION)
        if not destination:
            raise ValueError(
                f"operation {message_id}: Options has no Destination (only unicast sends can "
                f"be dispatched; options: {sorted(options)})"
            )
        addressing.QueueAddress.parse(destination)
        body = data.get("Body")
        if body is not None and not isinstance(body, str):
            raise ValueError(f"operation {message_id}: Body is not a base64 string")
        try:
            raw = None if body is None else base64.b64decode(body, validate=True)
        except binascii.Error as error:
            raise ValueError(f"operation {message_id}: Body is not base64: {error}") from None
        operation = cls(message_id, dict(message_headers), raw, dict(options))
        if TIME_TO_BE_RECEIVED in options:
            try:
                operation.ttbr_ms  # noqa: B018  (validates the TimeSpan now, not at send time)
            except ValueError as error:
                raise ValueError(f"operation {message_id}: {error}") from None
        return operation


def serialize_operations(operations: Sequence[OutboxOperation]) -> str:
    """``Operations`` column text: a JSON array of ``SerializableOperation`` objects."""
    return json.dumps([operation.to_json() for operation in operations], ensure_ascii=False)


def deserialize_operations(text: str) -> list[OutboxOperation]:
    """Parse the ``Operations`` column.

    :raises ValueError: saying what is wrong with *text*.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"Operations is a JSON {type(data).__name__}, not an array")
    return [OutboxOperation.from_json(item) for item in data]


@dataclasses.dataclass(frozen=True)
class OutboxRecord:
    """One row of ``OutboxData`` as :meth:`Outbox.get` reads it."""

    message_id: str
    dispatched: bool
    dispatched_at: dt.datetime | None
    operations: list[OutboxOperation]


@dataclasses.dataclass(frozen=True)
class OutboxBacklog:
    """The records of ``OutboxData`` still to dispatch, and the oldest of them.

    ``oldest_due`` is the ``DispatchedAt`` of the oldest undispatched record: when it was stored,
    or when it may next be tried after a failed dispatch (records NServiceBus wrote leave it NULL
    until dispatched and are counted but never the oldest).
    """

    pending: int
    oldest_message_id: str | None
    oldest_due: dt.datetime | None


@dataclasses.dataclass
class DispatchReport:
    """What one dispatch did: records claimed, dispatched and deferred, messages per queue.

    ``already_delivered``: messages for other databases not sent because that database's
    ``OutboxDelivery`` shows an earlier dispatch delivered them (one that crashed before marking
    its record).
    """

    claimed: int = 0
    dispatched: int = 0
    deferred: int = 0
    messages: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    already_delivered: int = 0

    def add(self, other: DispatchReport) -> None:
        """Add *other*'s counts to these."""
        self.claimed += other.claimed
        self.dispatched += other.dispatched
        self.deferred += other.deferred
        self.messages.update(other.messages)
        self.already_delivered += other.already_delivered

    def describe(self) -> str:
        """One log line: counts and messages per queue."""
        queues = ", ".join(f"{queue}: {count}" for queue, count in sorted(self.messages.items()))
        text = f"dispatched {self.dispatched} record(s), {sum(self.messages.values())} message(s)"
        if queues:
            text += f" ({queues})"
        if self.already_delivered:
            text += f"; {self.already_delivered} message(s) already delivered, not sent again"
        if self.deferred:
            text += f"; {self.deferred} record(s) failed and wait for a retry"
        return text
