"""Reads that take nothing: a queue's messages oldest first, delayed messages earliest due first.

``Transport.browse`` and ``Transport.browse_delayed`` run these on a connection;
``sqlqueue browse``, ``sqlqueue delayed list`` and the dashboard show what they return;
``sqlqueue peek`` counts a small queue with :func:`count_queue`. Nothing is locked, deleted or
moved, and nothing here commits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sqlqueue_orm import addressing, db, dialects, exceptions, headers
from sqlqueue_orm.messages import IncomingMessage
from sqlqueue_orm.models import delayed_table as delayed_model
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.queuing import rows as row_reading
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION


def read_queue(
    connection: Connection,
    address: addressing.QueueAddress,
    max_messages: int,
    after: int | None = None,
) -> list[IncomingMessage]:
    """Up to *max_messages* messages of the queue at *address*, oldest first.

    Every row, expired ones (flagged ``expired=True``) and rows another receiver holds included.
    *after*: only rows whose RowVersion is above it. The columns are read as the driver returns
    them, not through their SQLAlchemy types, so a row whose values are not of their declared
    types comes out as a poison message (see :mod:`sqlqueue_orm.queuing.rows`).
    """
    dialect = connection.dialect
    table = queue_table(address.table, db.schema_argument(address), dialect)
    text = sql.for_dialect(dialect)
    # Read as the receive reads them, so headers no driver can decode come back raw.
    quoted = dialect.identifier_preparer.quote(table.c.Headers.name)
    raw_headers: sa.ColumnElement[Any] = sa.literal_column(
        text.headers_read.format(headers=quoted)
    )
    quote = dialect.identifier_preparer.quote
    statement = sa.select(
        sa.literal_column(text.id_read.format(id=quote(table.c.Id.name))),
        table.c.RowVersion,
        sa.literal_column(text.expired_read.format(expires=quote(table.c.Expires.name))),
        raw_headers,
        sa.literal_column(text.body_read.format(body=quote(table.c.Body.name))),
    )
    if after is not None:
        statement = statement.where(table.c.RowVersion > after)
    statement = statement.order_by(table.c.RowVersion).limit(max_messages)
    with db.wrap_db_errors(str(address)):
        rows = connection.execute(statement).all()
    # The rows as the receive returns them: Id, RowVersion, expired, Headers, Body.
    return [
        row_reading.read_received(row, str(address), text.headers_encoding, text.stored_value)
        for row in rows
    ]


@dataclasses.dataclass(frozen=True)
class DelayedMessage:
    """A message waiting in a delayed table (see ``Transport.browse_delayed``)."""

    #: The delayed table's address.
    table: str
    #: When it is due (UTC).
    due: dt.datetime
    #: Where it goes then (``NServiceBus.SqlServer.ForwardDestination``).
    destination: str | None
    headers: dict[str, str | None]
    body: bytes | None

    @property
    def message_id(self) -> str | None:
        """``NServiceBus.MessageId``, if it has one."""
        return self.headers.get(headers.MESSAGE_ID)

    @classmethod
    def from_row(cls, table: str, due: object, text: object, body: object) -> DelayedMessage:
        """From a row as the driver returns it (Due as a datetime, or SQLite's UTC text)."""
        moment = due if isinstance(due, dt.datetime) else dt.datetime.fromisoformat(str(due))
        moment = moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment
        parsed, _, _ = headers.decode(text, "utf-8")
        return cls(
            table,
            moment.astimezone(dt.UTC),
            parsed.get(FORWARD_DESTINATION),
            parsed,
            None if body is None else bytes(body),  # type: ignore[call-overload]
        )


def count_queue(
    connection: Connection, address: addressing.QueueAddress, most: int
) -> int | None:
    """How many messages the queue at *address* holds, counted, or None when more than *most*.

    Exact where a peek estimates (max - min ``RowVersion``, which counts the gaps rolled-back
    sends leave), at a cost bounded by *most* rows whatever the depth. Rows still being written
    or received are skipped, not waited for (the dialect's
    :attr:`~sqlqueue_orm.dialects.base.DialectSupport.committed_read_hint`).
    """
    dialect = connection.dialect
    table = queue_table(address.table, db.schema_argument(address), dialect)
    rows: sa.Select[Any] = sa.select(table.c.RowVersion).select_from(table).limit(most + 1)
    hint = dialects.for_dialect(dialect).committed_read_hint
    if hint is not None:
        rows = rows.with_hint(table, hint)
    with db.wrap_db_errors(str(address)):
        found = int(connection.scalar(sa.select(sa.func.count()).select_from(rows.subquery()))
                    or 0)
    return None if found > most else found


def require_delayed_table(
    connection: Connection, endpoint: str, address: addressing.QueueAddress
) -> None:
    """Raise :class:`ConfigurationError` when *endpoint* has no delayed table at *address*."""
    if not sa.inspect(connection).has_table(address.table, db.schema_argument(address)):
        raise exceptions.ConfigurationError(
            f"endpoint {endpoint!r} has no delayed table {str(address)!r} (an "
            "endpoint creates it when it starts)"
        )


def read_delayed(
    connection: Connection,
    addresses: Iterable[addressing.QueueAddress],
    max_messages: int,
) -> list[DelayedMessage]:
    """Up to *max_messages* messages of the delayed tables at *addresses*, earliest due first.

    Reads only: nothing is locked, taken or moved.
    """
    found: list[DelayedMessage] = []
    for address in addresses:
        table = delayed_model.delayed_table(
            address.table, db.schema_argument(address), connection.dialect
        )
        statement = (
            sa.select(
                sa.type_coerce(table.c.Due, sa.String()).label("due"),
                table.c.Headers,
                table.c.Body,
            )
            .order_by(table.c.Due)
            .limit(max_messages)
        )
        with db.wrap_db_errors(str(address)):
            rows = connection.execute(statement).all()
        found.extend(
            DelayedMessage.from_row(str(address), row.due, row.Headers, row.Body)
            for row in rows
        )
    found.sort(key=lambda message: message.due)
    return found[:max_messages]
