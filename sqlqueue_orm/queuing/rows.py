"""Reading a queue row whose columns may not hold what the table declares.

SQLite stores any value in any column: an ``Id`` that is not a UUID, a ``Body`` that is text
or a number, an ``Expires`` that is not a date. The receive reads its rows the fast way first
(:meth:`TableQueue._messages <sqlqueue_orm.queuing.table_queue.TableQueue>`); only when that
fails are they read here, one by one: a row that cannot be read comes out as a poison message
(``headers_error`` naming each column, ``stored_values`` holding what is stored), so no row of
the batch is lost with it or held back behind it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sqlqueue_orm.messages import IncomingMessage

#: The native id of a message whose stored Id is not a UUID.
UNREADABLE_ID = uuid.UUID(int=0)
#: Longest shown form of a stored value in an error text.
_SHOWN = 60


def shown(value: object) -> str:
    """*value* as an error text shows it: its repr (one line), cut short, and its type."""
    text = repr(value)
    if len(text) > _SHOWN:
        text = text[: _SHOWN - 3] + "..."
    return f"{text} ({type(value).__name__})"


def native_id(value: object) -> uuid.UUID | None:
    """The returned Id *value* as a UUID, or None when it is not one.

    A UUID, or text holding one (as bytes where the dialect returns the Id's text so).
    """
    if isinstance(value, uuid.UUID):
        return value
    try:
        if type(value) is bytes:
            return uuid.UUID(value.decode("ascii"))
        if type(value) is str:
            return uuid.UUID(value)
    except ValueError:
        return None
    return None


def body_bytes(value: object) -> bytes | None:
    """The stored Body *value* as bytes (None for NULL).

    :raises TypeError: it is not binary (text, a number): never made into bytes, as
        ``bytes(5)`` would make five zero bytes of an INTEGER 5.
    """
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a Body of {type(value).__name__} is not binary")


def _as_stored(column: str, value: object) -> object:
    return value


def read(
    returned_id: object,
    row_version: int,
    expired: bool | None,
    returned_expires: object,
    raw_headers: object,
    returned_body: object,
    queue: str,
    headers_encoding: str,
    stored_value: Callable[[str, object], object] = _as_stored,
) -> IncomingMessage:
    """The message of one row, whatever its columns hold; never raises because of them.

    :param expired: whether its expiry passed; None when Expires cannot be read as a date
        (*returned_expires* then holds what the statement returned for it).
    :param stored_value: the dialect's ``SqlText.stored_value``: what is stored, from what
        the statement returned for a column.
    """
    errors: list[str] = []
    stored: dict[str, object] = {}
    found_id = native_id(returned_id)
    if found_id is None:
        stored["Id"] = value = stored_value("Id", returned_id)
        errors.append(f"Id {shown(value)} is not a UUID")
        found_id = UNREADABLE_ID
    try:
        body = body_bytes(returned_body)
    except TypeError:
        stored["Body"] = value = stored_value("Body", returned_body)
        errors.append(f"Body {shown(value)} is not binary")
        body = None
    if expired is None:
        stored["Expires"] = value = stored_value("Expires", returned_expires)
        errors.append(f"Expires {shown(value)} is not a date")
    message = IncomingMessage.from_row(
        found_id, row_version, raw_headers, body, bool(expired), queue, headers_encoding
    )
    if not errors:
        return message
    if message.headers_error is not None:
        errors.append(f"Headers: {message.headers_error}")
    return IncomingMessage(
        message.id, message.row_version, {}, message.body, message.expired,
        message.raw_headers, "; ".join(errors), queue, stored,
    )


def read_received(row: Any, queue: str, headers_encoding: str,
                  stored_value: Any) -> IncomingMessage:
    """:func:`read` of one row as a receive returns it: Id, RowVersion, expired, Headers, Body.

    The receive's expired column is a boolean (0 or 1), or, where Expires cannot be read as a
    date, another value. *stored_value* (the dialect's) turns what the receive returned for a
    column that is not of its type into what is stored.
    """
    flag = row[2]
    readable = type(flag) is bool or (type(flag) is int and flag in (0, 1))
    return read(
        row[0], int(row[1]), bool(flag) if readable else None, flag, row[3], row[4], queue,
        headers_encoding, stored_value,
    )
