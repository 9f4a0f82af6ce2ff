"""An error queue as a list of failed messages: read them, send them back, or delete them.

::

    errors = ErrorQueue(transport)                 # the queue named "error"
    for failed in errors.list(exception_type="ValueError"):
        print(failed.id, failed.failed_queue, failed.exception_message)
    errors.retry([failed.id])                      # back to its queue, failure headers removed

Reading is non-destructive (nothing is locked or taken). :meth:`ErrorQueue.retry` and
:meth:`ErrorQueue.delete` take one row at a time by its native ``Id``, each in a transaction of
its own: the row is locked with the dialect's receive hints and deleted, its copy sent, and the
transaction committed, so a crash leaves the message in exactly one of the two queues, and two
operators retrying the same message send it once (the second finds the row held, or gone).

A retried message keeps its body byte for byte, its ``NServiceBus.MessageId`` and every header
but those that describe the failure (:data:`FAILURE_HEADERS` and ``NServiceBus.ExceptionInfo.*``).
A row whose headers cannot be read (a poison message, moved as it was stored) names no queue to
go back to: it is left where it is, with a warning; delete it, or fix and send it by hand.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import db, exceptions, headers
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.queuing import rows, sql

if TYPE_CHECKING:
    from sqlqueue_orm.queuing.table_queue import TableQueue
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Headers a retry removes (with every ``NServiceBus.ExceptionInfo.*``): they describe the
#: failure, or count retries that start over once the message is back in its queue.
FAILURE_HEADERS = frozenset(
    {
        headers.FAILED_QUEUE,
        headers.TIME_OF_FAILURE,
        headers.PROCESSING_ENDPOINT,
        headers.PROCESSING_MACHINE,
        "NServiceBus.Retries",
        "NServiceBus.Retries.Timestamp",
        "NServiceBus.FLRetries",
    }
)
#: Rows read per page while listing.
_PAGE = 500


@dataclasses.dataclass(frozen=True)
class FailedMessage:
    """One message of an error queue, with what its failure headers say.

    ``headers`` is empty and ``raw_headers`` holds the stored text (or bytes) when the headers
    cannot be read (a poison message); the failure fields are then None.
    """

    #: The row's native ``Id`` (a GUID, as text): what :meth:`ErrorQueue.get`, ``retry`` and
    #: ``delete`` take.
    id: str
    #: ``NServiceBus.MessageId``, or the row's id when there is none.
    message_id: str
    #: ``NServiceBus.FailedQ``: the queue (address) the message failed in.
    failed_queue: str | None
    #: ``NServiceBus.ExceptionInfo.ExceptionType``.
    exception_type: str | None
    #: ``NServiceBus.ExceptionInfo.Message``.
    exception_message: str | None
    #: ``NServiceBus.TimeOfFailure`` (aware, UTC), None when missing or unreadable.
    time_of_failure: dt.datetime | None
    #: ``NServiceBus.ProcessingEndpoint``.
    processing_endpoint: str | None
    headers: dict[str, str | None]
    raw_headers: str | bytes
    body: bytes

    @classmethod
    def from_message(cls, message: IncomingMessage) -> FailedMessage:
        """The failed message of a row read from an error queue."""
        found = message.headers
        failed_at = found.get(headers.TIME_OF_FAILURE)
        try:
            time_of_failure = headers.parse_time(failed_at) if failed_at else None
        except ValueError:
            time_of_failure = None
        return cls(
            id=str(message.id),
            message_id=message.message_id,
            failed_queue=found.get(headers.FAILED_QUEUE),
            exception_type=found.get(headers.EXCEPTION_TYPE),
            exception_message=found.get(headers.EXCEPTION_MESSAGE),
            time_of_failure=time_of_failure,
            processing_endpoint=found.get(headers.PROCESSING_ENDPOINT),
            headers=dict(found),
            raw_headers=message.raw_headers,
            body=message.body or b"",
        )


def parse_id(text: str) -> uuid.UUID:
    """*text* as a row id (a GUID, with or without braces and dashes).

    :raises ConfigurationError: naming *text* when it is not one.
    """
    try:
        return uuid.UUID(str(text).strip())
    except ValueError:
        raise exceptions.ConfigurationError(
            f"{text!r} is not an error-queue message id (a GUID such as "
            "'0b0e4b6c-8c4e-4c1e-9f58-6d1b3a2a9f10')"
        ) from None


def retry_headers(found: dict[str, str | None]) -> dict[str, str | None]:
    """*found* without the headers that describe the failure (see :data:`FAILURE_HEADERS`)."""
    return {
        key: value
        for key, value in found.items()
        if key not in FAILURE_HEADERS and not key.startswith(headers.EXCEPTION_INFO_PREFIX)
    }


def aware(moment: dt.datetime | None) -> dt.datetime | None:
    """*moment* with a time zone: a naive one is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=dt.UTC)  # naive means UTC, as headers.format_time reads it


def type_matches(wanted: str, found: str | None) -> bool:
    """``ValueError`` matches ``builtins.ValueError`` and ``System.ArgumentException`` its own."""
    if found is None:
        return False
    return found == wanted or found.rsplit(".", 1)[-1] == wanted


class ErrorQueue:
    """The failed messages of one error queue of *transport*.

    :param transport: the :class:`~sqlqueue_orm.transport.Transport` of the database.
    :param name: the error queue (``EndpointSettings.error_queue``; NServiceBus's default
        ``error``).
    """

    def __init__(self, transport: Transport, name: str = "error") -> None:
        self.transport = transport
        self.name = name
        self.address = transport.queues.address(name)

    def __repr__(self) -> str:
        return f"ErrorQueue({self.name!r})"

    # -- reading -----------------------------------------------------------------------------
    def _rows(self) -> Iterator[IncomingMessage]:
        """Every row, oldest first, a page at a time (nothing locked or taken)."""
        after: int | None = None
        while True:
            page = self.transport.browse(self.name, _PAGE, after=after)
            yield from page
            if len(page) < _PAGE:
                return
            after = page[-1].row_version

    def list(
        self,
        *,
        limit: int = 100,
        exception_type: str | None = None,
        endpoint: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> list[FailedMessage]:
        """Up to *limit* failed messages, oldest first, that match every filter given.

        :param exception_type: the exception's full type name, or its last part
            (``ValueError`` matches ``builtins.ValueError``).
        :param endpoint: the ``NServiceBus.ProcessingEndpoint`` that failed it.
        :param since: failed at or after (a naive datetime is UTC).
        :param until: failed before.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise exceptions.ConfigurationError(f"limit {limit!r} must be a whole number >= 1")
        start, end = aware(since), aware(until)
        found: list[FailedMessage] = []
        for row in self._rows():
            failed = FailedMessage.from_message(row)
            if exception_type is not None and not type_matches(
                exception_type, failed.exception_type
            ):
                continue
            if endpoint is not None and failed.processing_endpoint != endpoint:
                continue
            if start is not None or end is not None:
                when = failed.time_of_failure
                if when is None or (start is not None and when < start):
                    continue
                if end is not None and when >= end:
                    continue
            found.append(failed)
            if len(found) >= limit:
                break
        return found

    def shown_queue(self, failed: FailedMessage) -> str | None:
        """The queue *failed* failed in as a person reads it, or None when no header names it.

        ``NServiceBus.FailedQ`` holds the address as the .NET transport writes it
        (``"public"."billing"`` on PostgreSQL); shown, a queue of the default schema is its
        short name (``billing``), as the listings of queues show it. ``failed_queue`` keeps the
        header as stored.
        """
        if not failed.failed_queue:
            return None
        return self.transport.queues.shown_name(failed.failed_queue)

    def table(self) -> sa.Table:
        """The error queue's table."""
        return queue_table(
            self.address.table, db.schema_argument(self.address), self.transport.engine.dialect
        )

    def select_messages(self, *, body: bool = True) -> sa.Select[Any]:
        """``SELECT Id, RowVersion, Headers (as read on this dialect)[, Body]`` of the queue.

        Add ``where`` and ``order_by``; turn each row into a message with :meth:`message_of`.
        """
        engine = self.transport.engine
        table = self.table()
        text = sql.for_dialect(engine.dialect)
        quote = engine.dialect.identifier_preparer.quote
        # Read as the receive reads them, so a poison row moved as stored comes back raw.
        columns: list[sa.ColumnElement[Any]] = [
            sa.literal_column(text.id_read.format(id=quote(table.c.Id.name))),
            table.c.RowVersion,
            sa.literal_column(text.headers_read.format(headers=quote(table.c.Headers.name))),
        ]
        if body:
            columns.append(sa.literal_column(text.body_read.format(body=quote(table.c.Body.name))))
        return sa.select(*columns).select_from(table)

    def message_of(self, row: sa.Row[Any]) -> IncomingMessage:
        """The message of a row of :meth:`select_messages` (never raises for its columns)."""
        values = tuple(row)
        text = sql.for_dialect(self.transport.engine.dialect)
        return rows.read(
            values[0], int(values[1]), False, None, values[2],
            values[3] if len(values) > 3 else None, str(self.address), text.headers_encoding,
            text.stored_value,
        )

    def get(self, id: str) -> FailedMessage | None:
        """The failed message whose row id is *id*, or None (nothing is locked or taken).

        :raises ConfigurationError: *id* is not a GUID.
        """
        native_id = parse_id(id)
        engine = self.transport.engine
        statement = self.select_messages().where(self.table().c.Id == native_id)
        with db.wrap_db_errors(str(self.address)), engine.connect() as connection:
            row = connection.execute(statement).first()
        if row is None:
            return None
        return FailedMessage.from_message(self.message_of(row))

    def count(self) -> int:
        """How many messages the error queue holds (an exact count)."""
        statement = sa.select(sa.func.count()).select_from(self.table())
        with db.wrap_db_errors(str(self.address)), self.transport.engine.connect() as connection:
            return int(connection.execute(statement).scalar_one())

    # -- changing ----------------------------------------------------------------------------
    def _chosen(self, ids: Iterable[str]) -> tuple[TableQueue, tuple[uuid.UUID, ...]]:
        """The table queue of this queue and every one of *ids* parsed, before any is changed."""
        native_ids = tuple(parse_id(each) for each in ids)
        return self.transport.queues.table_queue(self.name), native_ids

    def retry(self, ids: Iterable[str]) -> int:
        """Send each message back to its ``NServiceBus.FailedQ``; return how many were sent.

        One transaction per message: take its row, send the copy (failure headers removed,
        body and message id unchanged), commit. An id not in the queue (or held by another
        retry), a message that names no queue, or one whose queue does not exist (or cannot
        be read as an address here) stays where it is, with a warning; the others go on.

        :raises ConfigurationError: an id is not a GUID (checked before anything is sent).
        """
        table_queue, native_ids = self._chosen(ids)
        sent = 0
        for native_id in native_ids:
            with db.wrap_db_errors(str(self.address)), self.transport.engine.connect() as conn:
                transaction = conn.begin()
                try:
                    message = table_queue.receive_by_id(conn, native_id)
                    if message is None:
                        log.warning(
                            "queue %s: no message %s to retry (gone, or being retried)",
                            self.name,
                            native_id,
                        )
                        transaction.rollback()
                        continue
                    destination = message.headers.get(headers.FAILED_QUEUE)
                    if message.headers_error is not None or not destination:
                        log.warning(
                            "queue %s: message %s names no queue to go back to (%s); left here",
                            self.name,
                            native_id,
                            message.headers_error or f"no {headers.FAILED_QUEUE} header",
                        )
                        transaction.rollback()
                        continue
                    copy = OutgoingMessage(
                        body=message.body,
                        headers=retry_headers(message.headers),
                        message_id=message.message_id,
                    )
                    try:
                        self.transport.send(destination, copy, connection=conn)
                    except (exceptions.QueueNotFound, exceptions.ConfigurationError) as error:
                        log.warning(
                            "queue %s: message %s cannot go back to %s (%s); left here",
                            self.name,
                            native_id,
                            destination,
                            error,
                        )
                        transaction.rollback()
                        continue
                    transaction.commit()
                except BaseException:
                    if transaction.is_active:
                        transaction.rollback()
                    raise
            sent += 1
            log.info(
                "queue %s: message %s (%s) sent back to %s",
                self.name,
                message.message_id,
                native_id,
                destination,
            )
        return sent

    def retry_all(self, failed_queue: str | None = None) -> int:
        """:meth:`retry` every message (that failed in *failed_queue*, if given)."""
        return self.retry(self.retryable_ids(failed_queue))

    def retryable_ids(self, failed_queue: str | None = None) -> tuple[str, ...]:
        """The ids :meth:`retry_all` sends back, oldest first.

        Every message that names the queue it failed in (*failed_queue*, if given).
        """
        # Compared as written (with the schema on PostgreSQL): "sales" and "public"."sales" match.
        wanted = None if failed_queue is None else self.transport.queues.qualified(failed_queue)
        ids = []
        for row in self._rows():
            found = row.headers.get(headers.FAILED_QUEUE)
            if not found:
                continue
            if wanted is not None:
                try:
                    if self.transport.queues.qualified(found) != wanted:
                        continue
                except exceptions.ConfigurationError:
                    continue
            ids.append(str(row.id))
        return tuple(ids)

    def delete(self, ids: Iterable[str]) -> int:
        """Delete each message (one transaction each); return how many were deleted.

        :raises ConfigurationError: an id is not a GUID (checked before anything is deleted).
        """
        table_queue, native_ids = self._chosen(ids)
        deleted = 0
        for native_id in native_ids:
            with db.wrap_db_errors(str(self.address)), self.transport.engine.begin() as conn:
                message = table_queue.receive_by_id(conn, native_id)
            if message is None:
                log.warning("queue %s: no message %s to delete", self.name, native_id)
                continue
            deleted += 1
            log.info("queue %s: message %s (%s) deleted", self.name, message.message_id,
                     native_id)
        return deleted
