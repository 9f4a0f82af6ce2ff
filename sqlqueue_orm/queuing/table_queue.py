"""TableQueue: send, receive, peek and purge one queue table on the caller's Connection.

Every operation takes a :class:`~sqlalchemy.engine.Connection` and runs on it, so it joins
whatever transaction the caller has open (NServiceBus's ``TableBasedQueue`` takes the caller's
``DbConnection`` and ``DbTransaction`` the same way). Nothing here commits.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, db
from sqlqueue_orm.messages import IncomingMessage, PreparedMessage
from sqlqueue_orm.queuing import sql

log = logging.getLogger(__name__)

#: Default batch of :meth:`TableQueue.purge_expired`, as NServiceBus.
PURGE_BATCH_SIZE = 10_000


class TableQueue:
    """One queue table on one dialect; statements are rendered once and reused.

    :param address: the queue's address.
    :param dialect: the dialect of the connections it will be given.
    """

    def __init__(self, address: addressing.QueueAddress, dialect: Dialect) -> None:
        address.check_for(dialect.name)
        self.address = address
        self.name = str(address)
        self.dialect_name = dialect.name
        self._text = sql.for_dialect(dialect)
        table = sql.format_table(dialect, address)
        self.quoted_table = table
        self._dialect = dialect
        self._send = sql.render(self._text.send, dialect, table)
        self._send_plain = sql.render(self._text.send_without_recoverable, dialect, table)
        self._receive = sql.render(self._text.receive, dialect, table)
        self._peek = sql.render(self._text.peek, dialect, table)
        self._purge = sql.render(self._text.purge_expired, dialect, table)
        self._purge_all = sql.render(self._text.purge_all, dialect, table)
        self._receive_advisory = self._purge_advisory = None
        if self._text.receive_without_row_locks and self._text.purge_expired_without_row_locks:
            self._receive_advisory = sql.render(
                self._text.receive_without_row_locks, dialect, table
            )
            self._purge_advisory = sql.render(
                self._text.purge_expired_without_row_locks, dialect, table
            )
        self._id_to_driver = self._text.id_to_driver
        self._lock = threading.Lock()
        self._has_recoverable: bool | None = None
        self._may_lock_rows: bool | None = None

    def __repr__(self) -> str:
        return f"TableQueue({self.name!r}, {self.dialect_name!r})"

    # -- sending -----------------------------------------------------------------------------
    def send(self, connection: Connection, messages: Sequence[PreparedMessage]) -> None:
        """Insert *messages* in the caller's transaction (one statement; executemany for many)."""
        if not messages:
            return
        statement = self._send if self._recoverable(connection) else self._send_plain
        to_driver = self._id_to_driver
        rows = [
            statement.params(
                {
                    "id": to_driver(message.id),
                    "ttbr": message.ttbr_ms,
                    "headers": message.headers,
                    "body": message.body,
                }
            )
            for message in messages
        ]
        with db.wrap_db_errors(self.name, on_missing_column=self._forget_columns):
            if len(rows) == 1:
                connection.exec_driver_sql(statement.text, rows[0])
            else:
                connection.exec_driver_sql(statement.text, rows)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("queue %s: sent %d message(s)", self.name, len(rows))

    # -- receiving ---------------------------------------------------------------------------
    def receive(self, connection: Connection, max_messages: int = 1) -> list[IncomingMessage]:
        """Delete and return up to *max_messages* of the oldest rows no other receiver holds.

        Expired rows are deleted too and come back with ``expired=True``. The rows are gone only
        when the caller's transaction commits; a rollback puts them back in their places.
        """
        if (
            isinstance(max_messages, bool)
            or not isinstance(max_messages, int)
            or not (1 <= max_messages <= self._text.max_batch)
        ):
            raise ValueError(
                f"max_messages {max_messages!r} must be an integer from 1 to {self._text.max_batch}"
            )
        statement = self._receive
        values: dict[str, Any] = {"n": max_messages}
        if self._receive_advisory is not None and not self._row_locks_allowed(connection):
            statement = self._receive_advisory
            values["window"] = max_messages + 256
        with db.wrap_db_errors(self.name):
            rows = list(
                connection.exec_driver_sql(statement.text, statement.params(values)).fetchall()
            )
        if len(rows) > 1:
            rows.sort(key=lambda row: row[1])  # OUTPUT/RETURNING order is not guaranteed
        messages = [
            IncomingMessage.from_row(
                _to_uuid(row[0]), int(row[1]), row[3], _to_bytes(row[4]), bool(row[2]), self.name
            )
            for row in rows
        ]
        if messages:
            expired = sum(1 for message in messages if message.expired)
            log.debug(
                "queue %s: received %d message(s), %d expired", self.name, len(messages), expired
            )
        return messages

    def peek(self, connection: Connection) -> int:
        """Estimated number of messages: max - min of RowVersion, the same cost at any size."""
        with db.wrap_db_errors(self.name):
            value = connection.exec_driver_sql(self._peek.text, self._peek.params({})).scalar()
        return int(value or 0)

    def purge_expired(self, connection: Connection, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete one batch of expired messages; return how many were deleted."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size {batch_size!r} must be a positive integer")
        statement = self._purge
        values: dict[str, Any] = {"n": batch_size}
        if self._purge_advisory is not None and not self._row_locks_allowed(connection):
            statement = self._purge_advisory
            values["window"] = batch_size + 256
        with db.wrap_db_errors(self.name):
            result = connection.exec_driver_sql(statement.text, statement.params(values))
        return max(result.rowcount, 0)

    def purge_all(self, connection: Connection) -> int:
        """Delete every message in the queue; return how many."""
        with db.wrap_db_errors(self.name):
            result = connection.exec_driver_sql(
                self._purge_all.text, self._purge_all.params({})
            )
        return max(result.rowcount, 0)

    # -- schema probes (cached) -------------------------------------------------------------
    def _recoverable(self, connection: Connection) -> bool:
        """Whether the table still has ``Recoverable`` (NServiceBus 7+ tolerates dropping it)."""
        known = self._has_recoverable
        if known is None:
            with db.wrap_db_errors(self.name):
                columns = db.column_names(connection, self.address)
            known = self._has_recoverable = "Recoverable" in columns
            if not known:
                log.info("queue %s: no Recoverable column; sending without it", self.name)
        return known

    def _forget_columns(self) -> None:
        self._has_recoverable = None

    def _row_locks_allowed(self, connection: Connection) -> bool:
        """PostgreSQL: FOR UPDATE needs UPDATE privilege; without it, claim by advisory lock."""
        allowed = self._may_lock_rows
        if allowed is None:
            with db.wrap_db_errors(self.name):
                allowed = bool(
                    connection.execute(
                        sa.text("SELECT has_any_column_privilege(CAST(:t AS regclass), 'UPDATE')"),
                        {"t": self._regclass_text()},
                    ).scalar()
                )
            self._may_lock_rows = allowed
            if not allowed:
                log.warning(
                    "queue %s: this role may not UPDATE the table, so receives skip busy rows "
                    "with advisory locks instead of FOR UPDATE SKIP LOCKED; grant UPDATE on one "
                    'column (e.g. GRANT UPDATE ("Recoverable") ON ...) for the usual path',
                    self.name,
                )
        return allowed

    def _regclass_text(self) -> str:
        # regclass input takes the quoted name; SQLAlchemy's PostgreSQL preparer quoted it.
        return (
            self.quoted_table.replace("%%", "%")
            if self._dialect.paramstyle
            in (
                "format",
                "pyformat",
            )
            else self.quoted_table
        )


def _to_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _to_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return bytes(value)
