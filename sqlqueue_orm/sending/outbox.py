"""The outbox: store outgoing messages with the business data, dispatch them after commit.

An :class:`Outbox` stores records in the caller's transaction, reads them, dispatches them
(:class:`~sqlqueue_orm.sending.outbox_dispatch.OutboxDispatch`, its dispatching half) and cleans
up. What a record holds is in :mod:`~sqlqueue_orm.sending.outbox_records`, the statements it
runs in :mod:`~sqlqueue_orm.sending.outbox_statements`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from sqlqueue_orm import exceptions
from sqlqueue_orm.config import CLEANUP_BATCH_SIZE
from sqlqueue_orm.models import outbox_delivery
from sqlqueue_orm.models.base import Base
from sqlqueue_orm.models.outbox import TABLE_NAME, outbox_table
from sqlqueue_orm.sending.outbox_dispatch import OutboxDispatch
from sqlqueue_orm.sending.outbox_records import (
    PERSISTENCE_VERSION,
    OutboxBacklog,
    OutboxOperation,
    OutboxRecord,
    serialize_operations,
    utc_now,
)
from sqlqueue_orm.sending.outbox_statements import (
    cleanup_statement,
    delivery_cleanup_statement,
    outbox_errors,
)
from sqlqueue_orm.transport import Closing, Transport

#: ``Outbox`` and the operations its records hold, as applications import them.
__all__ = ["Outbox", "OutboxOperation"]

log = logging.getLogger(__name__)


class Outbox(OutboxDispatch, Closing):
    """The outbox of one database: storing, reading, dispatching and cleaning up records.

    Long-lived: make one per application (it keeps one engine per remote database it routes to)
    and :meth:`close` it at the end.

    :param transport: the transport of the database holding ``OutboxData`` (and local queues).
    :param routing: where queues in other databases live; ``None``: every queue is local.
    """

    def close(self) -> None:
        """Dispose of the engines of remote databases (not the local transport's)."""
        self.router.close()

    def create_table(self) -> bool:
        """Create ``OutboxData`` and its indexes if missing (what the Alembic revision does)."""
        with outbox_errors(), self.transport.engine.begin() as connection:
            exists = sa.inspect(connection).has_table(TABLE_NAME)
            Base.metadata.create_all(connection, tables=[outbox_table()], checkfirst=True)
        return not exists

    # -- records ---------------------------------------------------------------------------
    def store(
        self,
        connection: Connection,
        message_id: str,
        operations: Sequence[OutboxOperation],
        *,
        dispatched: bool = False,
        now: dt.datetime | None = None,
    ) -> None:
        """Insert a record in the caller's transaction.

        :param dispatched: store it as already dispatched (nothing left to send: the record only
            remembers that *message_id* was handled).
        :raises DuplicateMessage: a record with *message_id* exists (the primary key decides).
        """
        if not isinstance(message_id, str) or not message_id or len(message_id) > 200:
            raise exceptions.ConfigurationError(
                f"outbox message id {message_id!r} must be a string of 1 to 200 characters"
            )
        values = {
            "MessageId": message_id,
            "Dispatched": dispatched,
            "DispatchedAt": now or utc_now(),
            "PersistenceVersion": PERSISTENCE_VERSION,
            "Operations": serialize_operations(operations),
        }
        with outbox_errors():
            try:
                connection.execute(sa.insert(outbox_table()), values)
            except exc.IntegrityError as error:
                raise exceptions.DuplicateMessage(message_id) from error

    def store_many(
        self, connection: Connection, records: Iterable[tuple[str, Sequence[OutboxOperation]]]
    ) -> int:
        """Insert undispatched records in one statement (bulk loads); return how many."""
        now = utc_now()
        rows = [
            {
                "MessageId": message_id,
                "Dispatched": False,
                "DispatchedAt": now,
                "PersistenceVersion": PERSISTENCE_VERSION,
                "Operations": serialize_operations(operations),
            }
            for message_id, operations in records
        ]
        if rows:
            with outbox_errors():
                connection.execute(sa.insert(outbox_table()), rows)
        return len(rows)

    def get(self, connection: Connection, message_id: str) -> OutboxRecord | None:
        """Read the record of *message_id* (``None`` if there is none)."""
        table = outbox_table()
        with outbox_errors():
            row = connection.execute(
                sa.select(table.c.Dispatched, table.c.DispatchedAt, table.c.Operations).where(
                    table.c.MessageId == message_id
                )
            ).first()
        if row is None:
            return None
        dispatched = bool(row[0])
        operations = [] if dispatched else self._parse(message_id, row[2])
        return OutboxRecord(message_id, dispatched, row[1], operations)

    def backlog(self, connection: Connection | None = None) -> OutboxBacklog:
        """How many records wait for dispatch, and the oldest (reads only, locks nothing).

        :raises SchemaOutdated: the database has no ``OutboxData`` table.
        """
        table = outbox_table()
        pending = table.c.Dispatched == sa.false()
        count = sa.select(sa.func.count()).select_from(table).where(pending)
        oldest = (
            sa.select(table.c.MessageId, table.c.DispatchedAt)
            .where(pending, table.c.DispatchedAt.is_not(None))
            .order_by(table.c.DispatchedAt)
            .limit(1)
        )
        with outbox_errors(), contextlib.ExitStack() as stack:
            if connection is None:
                connection = stack.enter_context(self.transport.engine.connect())
            total = int(connection.scalar(count) or 0)
            row = connection.execute(oldest).first()
        if row is None:
            return OutboxBacklog(total, None, None)
        return OutboxBacklog(total, str(row[0]), row[1])

    def waiting_for_retry(
        self, connection: Connection | None = None, *, now: dt.datetime | None = None
    ) -> int:
        """How many undispatched records wait for a retry after a failed dispatch (reads only).

        A failed dispatch moves a record's ``DispatchedAt`` to when it may be tried again: the
        records waiting are those whose ``DispatchedAt`` is still to come. A record a dispatcher
        cannot route stays due in the table (one that has the route sends it at once) and is not
        counted here; that dispatcher's :meth:`skipped_for_route` counts it.
        """
        table = outbox_table()
        count = (
            sa.select(sa.func.count())
            .select_from(table)
            .where(
                table.c.Dispatched == sa.false(),
                table.c.DispatchedAt > sa.bindparam("now", type_=sa.DateTime()),
            )
        )
        with outbox_errors(), contextlib.ExitStack() as stack:
            if connection is None:
                connection = stack.enter_context(self.transport.engine.connect())
            return int(connection.scalar(count, {"now": now or utc_now()}) or 0)

    # -- cleanup ---------------------------------------------------------------------------
    def cleanup(
        self,
        older_than: dt.timedelta,
        *,
        batch_size: int = CLEANUP_BATCH_SIZE,
        now: dt.datetime | None = None,
        deliveries: bool = True,
    ) -> int:
        """Delete records dispatched before *older_than* ago, one transaction per batch.

        Returns how many records were deleted.

        :param deliveries: also delete ``OutboxDelivery`` rows older than that, here and in every
            routed database (see :meth:`cleanup_deliveries`).
        """
        cutoff = (now or utc_now()) - older_than
        total = self._delete_in_batches(
            self.transport, cleanup_statement(self.transport.engine.dialect), cutoff, batch_size
        )
        if total:
            log.info(
                "outbox: deleted %d dispatched record(s) older than %s",
                total,
                cutoff.isoformat(sep=" "),
            )
        if deliveries:
            self.cleanup_deliveries(older_than, batch_size=batch_size, now=now)
        return total

    def cleanup_deliveries(
        self,
        older_than: dt.timedelta,
        *,
        batch_size: int = CLEANUP_BATCH_SIZE,
        now: dt.datetime | None = None,
    ) -> int:
        """Delete ``OutboxDelivery`` rows older than *older_than*, here and in routed databases.

        A row is needed only until the dispatcher marks its record dispatched, so rows as old
        as the records :meth:`cleanup` deletes can go. A database without the table is skipped.
        Returns how many rows were deleted in all.
        """
        cutoff = (now or utc_now()) - older_than
        total = 0
        for transport in [self.transport, *self.router.remote_transports()]:
            url = transport.engine.url.render_as_string(hide_password=True)
            with outbox_errors(), transport.engine.connect() as connection:
                if not sa.inspect(connection).has_table(outbox_delivery.TABLE_NAME):
                    continue
            statement = delivery_cleanup_statement(transport.engine.dialect)
            deleted = self._delete_in_batches(transport, statement, cutoff, batch_size)
            if deleted:
                log.info(
                    "outbox: deleted %d %s row(s) older than %s in %s",
                    deleted,
                    outbox_delivery.TABLE_NAME,
                    cutoff.isoformat(sep=" "),
                    url,
                )
            total += deleted
        return total

    @staticmethod
    def _delete_in_batches(
        transport: Transport, statement: sa.Executable, cutoff: dt.datetime, batch_size: int
    ) -> int:
        total = 0
        while True:
            with outbox_errors():
                with transport.engine.begin() as connection:
                    result = connection.execute(
                        statement, {"batch_size": batch_size, "cutoff": cutoff}
                    )
            deleted = max(result.rowcount, 0)
            total += deleted
            if deleted < batch_size:
                return total
