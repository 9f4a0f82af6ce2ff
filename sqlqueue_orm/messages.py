"""Outgoing and incoming messages.

An :class:`OutgoingMessage` is what a user sends: a body (bytes, text or a pydantic model), headers
and an optional time to be received. :meth:`OutgoingMessage.prepare` turns it into the row the
queue table stores, setting the headers every NServiceBus endpoint expects. An
:class:`IncomingMessage` is one row taken off a queue.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from sqlqueue_orm import exceptions, headers

if TYPE_CHECKING:
    import pydantic

ModelT = TypeVar("ModelT", bound="pydantic.BaseModel")

#: The largest TTBR we store (Expires is a SQL Server ``datetime``; ~100 years is plenty).
_MAX_TTBR_MS = 100 * 366 * 86_400_000


def _message_type_name(model: type[Any]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


@dataclasses.dataclass(frozen=True)
class PreparedMessage:
    """A message as one row of a queue table (internal to the send path)."""

    #: The native Id; for a poison row moved on as it was stored, its stored Id when that is not
    #: a UUID (SQLite holds any value).
    id: uuid.UUID
    message_id: str
    #: Serialized headers; bytes only for a poison row moved on as it was stored (not text).
    headers: str | bytes
    #: The body; for a poison row moved on as it was stored, its stored Body whatever its type.
    body: bytes | None
    ttbr_ms: int | None


def _prepared(
    native_id: uuid.UUID, message_id: str, text: str, body: bytes | None, ttbr_ms: int | None
) -> PreparedMessage:
    """``PreparedMessage(...)`` with every field set at once (see ``IncomingMessage.from_row``)."""
    prepared = object.__new__(PreparedMessage)
    object.__setattr__(prepared, "__dict__", {
        "id": native_id, "message_id": message_id, "headers": text, "body": body,
        "ttbr_ms": ttbr_ms,
    })
    return prepared


@dataclasses.dataclass
class OutgoingMessage:
    """A message to send.

    :param body: bytes as they are, ``str`` as UTF-8, a pydantic model as JSON (which also sets
        ``NServiceBus.ContentType`` and ``NServiceBus.EnclosedMessageTypes``), or ``None``.
    :param headers: extra headers, strings to strings (``None`` is sent as JSON ``null``).
    :param message_id: ``NServiceBus.MessageId``; a new GUID unless given here or in *headers*.
    :param time_to_be_received: seconds or a timedelta; the message expires that long after the
        database receives the send (TTBR, measured by the database's clock).
    """

    body: bytes | str | pydantic.BaseModel | None = None
    headers: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    message_id: str | None = None
    time_to_be_received: dt.timedelta | float | None = None
    id: uuid.UUID = dataclasses.field(default_factory=uuid.uuid4)

    def prepare(self, now: dt.datetime | None = None) -> PreparedMessage:
        """Validate the message and build its row.

        :raises InvalidMessage: naming the bad body, header or TTBR.
        """
        given, body = self.headers, self.body
        # The usual send (bytes or no body, no TTBR, the caller's headers without MessageId and
        # TimeSent) in one step: no copy of the headers, their JSON from serialize_sent's cache.
        # Anything else, and anything to refuse, takes the general way below.
        if (
            (body is None or type(body) is bytes)
            and self.time_to_be_received is None
            and type(given) is dict
            and headers.MESSAGE_ID not in given
            and headers.TIME_SENT not in given
            and type(self.id) is uuid.UUID
        ):
            message_id = self.message_id or str(uuid.uuid4())
            if type(message_id) is str and message_id.strip():
                time_sent = headers.now_text() if now is None else headers.format_time(now)
                text = headers.serialize_sent(given, message_id, time_sent)
                return _prepared(self.id, message_id, text, body, None)
        return self._prepare(now)

    def _prepare(self, now: dt.datetime | None) -> PreparedMessage:
        """:meth:`prepare` of any message: every check, every header it may add."""
        out = dict(self.headers)
        # The usual send: prepare adds only MessageId and TimeSent, after the caller's headers,
        # whose JSON is then cached (see headers.serialize_sent).
        cached_form = headers.MESSAGE_ID not in out and headers.TIME_SENT not in out
        body = self.body
        data: bytes | None
        if body is None or type(body) is bytes or isinstance(body, bytes):
            data = body
        elif isinstance(body, bytearray | memoryview):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode("utf-8")
        elif hasattr(body, "model_dump_json"):
            data = body.model_dump_json().encode("utf-8")
            cached_form = False
            out.setdefault(headers.CONTENT_TYPE, "application/json")
            out.setdefault(headers.ENCLOSED_MESSAGE_TYPES, _message_type_name(type(body)))
        else:
            raise exceptions.InvalidMessage(
                f"message body {body!r} is a {type(body).__name__}; "
                "send bytes, str or a pydantic model"
            )
        message_id = self.message_id or out.get(headers.MESSAGE_ID) or str(uuid.uuid4())
        if not isinstance(message_id, str) or not message_id.strip():
            raise exceptions.InvalidMessage(f"message id {message_id!r} is empty")
        if not message_id.isascii():
            headers.check_text(message_id, "message id")
        out[headers.MESSAGE_ID] = message_id
        time_sent = ""
        if headers.TIME_SENT not in out:  # (a caller's None is kept: it is sent as null)
            time_sent = headers.now_text() if now is None else headers.format_time(now)
            out[headers.TIME_SENT] = time_sent
        ttbr_ms = None if self.time_to_be_received is None else self._ttbr_ms()
        if ttbr_ms is not None and headers.TIME_TO_BE_RECEIVED not in out:
            out[headers.TIME_TO_BE_RECEIVED] = headers.format_timespan(ttbr_ms / 1000)
            cached_form = False
        if type(self.id) is not uuid.UUID and not isinstance(self.id, uuid.UUID):
            raise exceptions.InvalidMessage(f"native id {self.id!r} is not a uuid.UUID")
        if cached_form:
            text = headers.serialize_sent(self.headers, message_id, time_sent)
        else:
            text = headers.serialize(out)
        return _prepared(self.id, message_id, text, data, ttbr_ms)

    def _ttbr_ms(self) -> int | None:
        value = self.time_to_be_received
        if value is None:
            return None
        seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise exceptions.InvalidMessage(
                f"time_to_be_received {value!r} is not a number of seconds or a timedelta"
            )
        if not math.isfinite(seconds) or seconds <= 0:
            raise exceptions.InvalidMessage(
                f"time_to_be_received {value!r} must be a positive, finite duration"
            )
        ms = max(1, round(seconds * 1000))
        if ms > _MAX_TTBR_MS:
            raise exceptions.InvalidMessage(
                f"time_to_be_received {value!r} is longer than 100 years; leave it unset instead"
            )
        return ms


@dataclasses.dataclass(frozen=True)
class IncomingMessage:
    """A message taken off a queue.

    ``expired`` is true when its TTBR had passed: the row is gone from the queue all the same, and
    a handler should discard it. A header whose stored value is JSON ``null`` (as .NET writes
    them) is ``None`` in ``headers``. ``headers_error`` is set (and ``headers`` empty) when the
    stored headers cannot be read for any reason (not JSON, not an object of strings and nulls,
    nested too deeply, not valid text: UTF-8 on SQLite, UTF-16 on SQL Server); ``raw_headers``
    always holds them as stored (text, or bytes when they are not valid text), so a poison
    message can be moved on unchanged.

    A row whose ``Id``, ``Body`` or ``Expires`` is not of the column's declared type (SQLite
    stores any value in any column) is a poison message too: ``headers_error`` names each such
    column and why, ``stored_values`` holds their values as stored (column name to value), and
    ``id`` (the nil UUID when the Id cannot be read), ``body`` (None) and ``expired`` (False: an
    expiry that cannot be read never discards a message) stand in for them.
    """

    id: uuid.UUID
    row_version: int
    headers: dict[str, str | None]
    body: bytes | None
    expired: bool
    raw_headers: str | bytes
    headers_error: str | None = None
    queue: str = ""
    #: The stored values of the columns that cannot be read, by column name; None when all can.
    stored_values: dict[str, object] | None = None

    @property
    def message_id(self) -> str:
        """``NServiceBus.MessageId``, falling back to the native id as NServiceBus does."""
        return self.headers.get(headers.MESSAGE_ID) or str(self.id)

    @property
    def text(self) -> str:
        """The body as UTF-8 text (``""`` for no body); undecodable bytes are replaced."""
        return (self.body or b"").decode("utf-8", errors="replace")

    def model(self, model_type: type[ModelT]) -> ModelT:
        """Parse the JSON body into *model_type* (a pydantic model class)."""
        return model_type.model_validate_json(self.body or b"")

    def to_outgoing(self) -> OutgoingMessage:
        """A copy to forward elsewhere (error or audit queue): same headers, body and message id."""
        return OutgoingMessage(
            body=self.body, headers=dict(self.headers), message_id=self.message_id
        )

    @classmethod
    def from_row(
        cls,
        native_id: uuid.UUID,
        row_version: int,
        raw_headers: object,
        body: bytes | None,
        expired: bool,
        queue: str = "",
        headers_encoding: str = "utf-8",
    ) -> IncomingMessage:
        """Build a message from a received row, flagging headers that cannot be read.

        :param raw_headers: the Headers column as the driver returned it (text, or bytes in
            *headers_encoding*); never raises because of it.
        """
        parsed, kept, error = headers.decode(raw_headers, headers_encoding)
        if cls is not IncomingMessage:  # a subclass may add fields or checks: its __init__
            return cls(native_id, row_version, parsed, body, expired, kept, error, queue)
        # Every field set at once: the frozen dataclass __init__ sets them one by one through
        # object.__setattr__, a third of building a message (test_messages checks they agree).
        message = object.__new__(cls)
        object.__setattr__(message, "__dict__", {
            "id": native_id, "row_version": row_version, "headers": parsed, "body": body,
            "expired": expired, "raw_headers": kept, "headers_error": error, "queue": queue,
            "stored_values": None,
        })
        return message
