"""What a receive forwards besides the handlers' sends: failures, poison rows, audit copies.

Each function builds the row exactly as NServiceBus's endpoints write it, so a .NET tool
(ServiceControl, ServicePulse, a .NET endpoint replaying the error queue) reads ours unchanged:

* a **failed** message (:func:`failed_row`) keeps its headers and body byte for byte and gains
  ``NServiceBus.FailedQ`` (the input queue's address as the .NET transport writes it),
  ``NServiceBus.TimeOfFailure`` (wire time format), ``NServiceBus.ExceptionInfo.ExceptionType``
  (``module.QualName``, as .NET writes ``Type.FullName``), ``.InnerExceptionType`` (the
  exception's cause, when it has one), ``.HelpLink`` (JSON ``null``, as .NET writes an unset
  ``Exception.HelpLink``), ``.Message`` (cut at 16,384 characters, as NServiceBus does),
  ``.Source`` (the module that raised it; .NET writes the assembly) and ``.StackTrace`` (the
  whole traceback, type and message included, as .NET writes ``Exception.ToString()``), plus
  ``NServiceBus.ProcessingEndpoint`` and ``NServiceBus.ProcessingMachine``
  (``ExceptionHeaderHelper`` and ``MoveToErrorsExecutor`` of NServiceBus core);
* a **poison** row (headers nobody can read, or an Id, Body or Expires not of its declared
  type) is copied as it is stored: same native Id, headers exactly as stored (text, or the
  very bytes when they are not valid text), same body, no headers added (the .NET transport's
  ``DeadLetter``);
* an **audit** copy (:func:`audit_row`) is the processed message with
  ``NServiceBus.ProcessingStarted``, ``ProcessingEnded`` (wire time format),
  ``ProcessingEndpoint`` and ``ProcessingMachine`` added, as NServiceBus's audit does.

Each is sent on the connection the strategy gives, so it joins the receive's transaction where
the mode has one (a crash then loses or doubles nothing: the move commits with the receive).
"""

from __future__ import annotations

import datetime as dt
import traceback
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import headers
from sqlqueue_orm.messages import IncomingMessage, PreparedMessage

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.transport import Transport

#: Longest exception message copied into the error queue's headers (as NServiceBus truncates).
MAX_EXCEPTION_MESSAGE = 16_384


def type_name(error: BaseException) -> str:
    """The exception's full type name (``builtins.ValueError``), as .NET's ``Type.FullName``."""
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}"


def _source(error: BaseException) -> str | None:
    """The module of the frame that raised *error* (None when it was never raised)."""
    trace = error.__traceback__
    if trace is None:
        return None
    while trace.tb_next is not None:
        trace = trace.tb_next
    name = trace.tb_frame.f_globals.get("__name__")
    return name if isinstance(name, str) else None


def _inner(error: BaseException) -> BaseException | None:
    if error.__cause__ is not None:
        return error.__cause__
    return None if error.__suppress_context__ else error.__context__


def exception_headers(
    error: BaseException, now: dt.datetime | None = None
) -> dict[str, str | None]:
    """``NServiceBus.ExceptionInfo.*`` and ``TimeOfFailure`` of *error*, as NServiceBus sets."""
    found: dict[str, str | None] = {headers.EXCEPTION_TYPE: type_name(error)}
    inner = _inner(error)
    if inner is not None:
        found[headers.EXCEPTION_INNER_TYPE] = type_name(inner)
    found[headers.EXCEPTION_HELP_LINK] = getattr(error, "help_link", None)
    found[headers.EXCEPTION_MESSAGE] = str(error)[:MAX_EXCEPTION_MESSAGE]
    found[headers.EXCEPTION_SOURCE] = _source(error)
    found[headers.EXCEPTION_STACK_TRACE] = "".join(traceback.format_exception(error))
    found[headers.TIME_OF_FAILURE] = headers.format_time(now or dt.datetime.now(dt.UTC))
    return found


def failure_headers(
    failed_queue: str, endpoint: str, machine: str, error: BaseException
) -> dict[str, str | None]:
    """Every header NServiceBus adds to a message it moves to the error queue.

    :param failed_queue: the input queue's address as the .NET transport writes it.
    :param endpoint: the processing endpoint's name.
    :param machine: the host name.
    """
    return {
        headers.FAILED_QUEUE: failed_queue,
        **exception_headers(error),
        headers.PROCESSING_ENDPOINT: endpoint,
        headers.PROCESSING_MACHINE: machine,
    }


def _forwarded(message: IncomingMessage, added: dict[str, str | None]) -> PreparedMessage:
    """*message* with *added* headers, as a new row (a new native Id, as NServiceBus sends)."""
    return PreparedMessage(
        uuid.uuid4(),
        message.message_id,
        headers.serialize({**message.headers, **added}),
        message.body,
        None,
    )


def failed_row(message: IncomingMessage, failure: dict[str, str | None]) -> PreparedMessage:
    """The error-queue row of *message*: its headers plus *failure*, its body unchanged."""
    return _forwarded(message, failure)


def poison_row(message: IncomingMessage) -> PreparedMessage:
    """The error-queue row of a row that cannot be read: the row as it is stored.

    Its headers as stored, and its Id and Body as stored when they are not of their declared
    types (``stored_values``); it never expires.
    """
    stored = message.stored_values or {}
    native_id: Any = stored.get("Id", message.id)
    body: Any = stored.get("Body", message.body)
    return PreparedMessage(native_id, str(message.id), message.raw_headers, body, None)


def audit_row(
    message: IncomingMessage,
    started: dt.datetime,
    ended: dt.datetime,
    endpoint: str,
    machine: str,
) -> PreparedMessage:
    """The audit copy of a processed *message* (headers and body unchanged, four added)."""
    return _forwarded(
        message,
        {
            headers.PROCESSING_STARTED: headers.format_time(started),
            headers.PROCESSING_ENDED: headers.format_time(ended),
            headers.PROCESSING_ENDPOINT: endpoint,
            headers.PROCESSING_MACHINE: machine,
        },
    )


def forward(
    transport: Transport,
    queue: str,
    row: PreparedMessage,
    connection: Connection | None,
    also: Callable[[Connection], None] | None = None,
) -> None:
    """Send *row* to *queue*: in *connection*'s transaction, else in one of its own.

    :param also: run after the send in the same transaction (the failure-group entry).
    """
    table_queue = transport.queues.table_queue(queue)
    if connection is not None:
        table_queue.send(connection, [row])
        if also is not None:
            also(connection)
        return
    with transport.engine.begin() as own:
        table_queue.send(own, [row])
        if also is not None:
            also(own)
