"""TableQueue: send, receive, peek and purge one queue table on the caller's Connection.

Every operation takes a :class:`~sqlalchemy.engine.Connection` and runs on it, so it joins
whatever transaction the caller has open (NServiceBus's ``TableBasedQueue`` takes the caller's
``DbConnection`` and ``DbTransaction`` the same way). Nothing here commits.

The hot path runs its pre-rendered statements on the DBAPI cursor of that same connection and
transaction, skipping SQLAlchemy's per-statement execution machinery (that is what keeps us near
the raw driver's rate). When the engine has ``before/after_cursor_execute`` listeners or echo
(tracing, SQL logging), statements go through ``exec_driver_sql`` instead, so those still see them.
"""

from __future__ import annotations

import logging
import operator
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, connections, db, dialects, exceptions
from sqlqueue_orm.messages import IncomingMessage, PreparedMessage
from sqlqueue_orm.queuing import floor as floor_module
from sqlqueue_orm.queuing import rows as row_reading
from sqlqueue_orm.queuing import sql

log = logging.getLogger(__name__)

#: A received row's sequence number (RowVersion, seq), what its messages are ordered by.
_SEQUENCE = operator.itemgetter(1)
#: Default batch of :meth:`TableQueue.purge_expired`, as NServiceBus.
PURGE_BATCH_SIZE = 10_000
#: How far past the batch the advisory-lock claim (PostgreSQL, no UPDATE privilege) looks.
_ADVISORY_WINDOW = 256
#: How many receive statements (one per row limit asked for) a queue keeps rendered.
_CACHED_LIMITS = 64
_NO_PARAMETERS: dict[str, Any] = {}
_FROM_ZERO: dict[str, Any] = {"floor": 0}
_UUID = uuid.UUID
#: The receive's expired column, read the fast way: any other value (an Expires that is not a
#: date) is a KeyError, and the batch is read the careful way.
_EXPIRED = {0: False, 1: True}
#: What the fast reading of a row raises when a column is not what the table declares.
_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError)


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
        self._send_plain = (
            self._send
            if self._text.send_without_recoverable == self._text.send
            else sql.render(self._text.send_without_recoverable, dialect, table)
        )
        # Receives by (row limit, advisory-lock variant), rendered on first use: see
        # _render_receive.
        self._receive_by_limit: dict[tuple[int, bool], tuple[sql.Statement, Any, bool]] = {}
        self._peek = sql.render(self._text.peek, dialect, table)
        #: Where receives and peeks start scanning (PostgreSQL; None where the dialect has no
        #: dead prefix to skip): see :mod:`sqlqueue_orm.queuing.floor`.
        self.floor: floor_module.ReceiveFloor | None = None
        self._peek_from_floor: sql.Statement | None = None
        if self._text.receive_from_floor and self._text.peek_from_floor:
            self.floor = floor_module.ReceiveFloor(self.name)
            self._peek_from_floor = sql.render(self._text.peek_from_floor, dialect, table)
        self._receive_by_id: sql.Statement | None = None  # rendered on first use
        # receive_claiming's statements by (key slots too, row limit, advisory variant)
        self._claiming: dict[tuple[bool, int, bool], sql.Statement] = {}
        #: Flow control's statements of the dialect (None: it has no shared locks).
        self._flow = dialects.for_dialect(dialect).flow
        self._purge = sql.render(self._text.purge_expired, dialect, table)
        self._purge_all = sql.render(self._text.purge_all, dialect, table)
        self._receive_advisory = self._purge_advisory = None
        if self._text.receive_without_row_locks and self._text.purge_expired_without_row_locks:
            self._receive_advisory = self._text.receive_without_row_locks
            self._purge_advisory = sql.render(
                self._text.purge_expired_without_row_locks, dialect, table
            )
        self._id_to_driver = self._text.id_to_driver
        dbapi = getattr(dialect, "loaded_dbapi", None) or getattr(dialect, "dbapi", None)
        self._dbapi_errors: tuple[type[BaseException], ...] = (
            getattr(dbapi, "Error", sa.exc.DBAPIError),
            sa.exc.DBAPIError,
        )
        self._fast_executemany = bool(getattr(dialect, "fast_executemany", False))
        self._has_recoverable: bool | None = None
        self._probe_ran = False  # probe() ran once (the *_on_cursor methods need it)
        self._may_lock_rows: bool | None = None if self._receive_advisory is not None else True

    def __repr__(self) -> str:
        return f"TableQueue({self.name!r}, {self.dialect_name!r})"

    # -- public operations on a SQLAlchemy Connection ---------------------------------------
    def send(self, connection: Connection, messages: Sequence[PreparedMessage]) -> None:
        """Insert *messages* in the caller's transaction (one statement; executemany for many)."""
        if messages:
            self.probe(connection)
            self._sent(messages, self._on(connection, self._send_args(messages)))

    def receive(self, connection: Connection, max_messages: int = 1) -> list[IncomingMessage]:
        """Delete and return up to *max_messages* of the oldest rows no other receiver holds.

        Expired rows are deleted too and come back with ``expired=True``. The rows are gone only
        when the caller's transaction commits; a rollback puts them back in their places.
        """
        self.probe(connection)
        if self.floor is not None:
            return self._receive_from_floor(self._on, connection, max_messages)
        rows = self._on(connection, self._receive_args(max_messages), fetch=True)
        return self._messages(rows)

    def receive_claiming(
        self,
        connection: Connection,
        max_messages: int,
        keys: bool,
        values: dict[str, Any],
    ) -> tuple[list[IncomingMessage], list[list[Any]]]:
        """:meth:`receive` claiming flow control's slots in the same statement.

        The dialect's receive with its claim columns after its own RETURNING list
        (:meth:`~sqlqueue_orm.dialects.flow.FlowStatements.claiming_receive`), binding *values*.

        :param keys: each row's key and its key slot's claim, then the global slot's
            (``receive_claiming``); else the global slot's claim alone (``receive_gated``).
        :returns: the messages, and each claim column as a list of its values, one per
            message in the same order (no list at all when nothing was taken; a batch's rows
            are not copied into a tuple each).
        :raises ValueError: the dialect's receive cannot claim.
        """
        self.probe(connection)
        key = (keys, max_messages, self._advisory())
        statement = self._claiming.get(key)
        if statement is None:
            if self._flow is None:
                raise ValueError(f"queue {self.name}: this dialect's receive cannot claim slots")
            template, literals = self._receive_template(max_messages, key[2])
            statement = sql.render(
                self._flow.claiming_receive(template, keys),
                self._dialect,
                self.quoted_table,
                literals,
            )
            if len(self._claiming) < _CACHED_LIMITS:
                self._claiming[key] = statement
        floor = self.floor
        position, epoch = floor.start() if floor is not None else (0, 0)
        if floor is not None:
            values = {**values, "floor": position}
        rows = self._on(connection, (statement, statement.params(values), False), True)
        if not rows and position:
            position = 0
            values = {**values, "floor": 0}
            rows = self._on(connection, (statement, statement.params(values), False), True)
        rows = sorted(rows, key=_SEQUENCE)  # RETURNING order is not guaranteed
        messages = self._messages(rows, ordered=True)
        if messages and floor is not None:
            floor.advance(messages[0].row_version, epoch, position)
        own = 5  # id, seq, expired, headers, body; the claim columns follow
        width = len(rows[0]) if rows else own
        columns = [list(map(operator.itemgetter(column), rows)) for column in range(own, width)]
        return messages, columns

    def receive_by_id(self, connection: Connection, native_id: uuid.UUID) -> IncomingMessage | None:
        """Delete and return the row whose native Id is *native_id*, or None.

        None too when another transaction holds that row (it is skipped, not waited for). Like
        :meth:`receive`, the row is gone only when the caller's transaction commits.
        """
        self.probe(connection)
        statement = self._receive_by_id
        if statement is None:
            statement = self._receive_by_id = sql.render(
                self._text.receive_by_id, self._dialect, self.quoted_table
            )
        params = statement.params({"id": self._id_to_driver(native_id)})
        messages = self._messages(self._on(connection, (statement, params, False), fetch=True))
        return messages[0] if messages else None

    def peek(self, connection: Connection) -> int:
        """Estimated number of messages: max - min of RowVersion (seq), cheap at any size.

        On PostgreSQL it counts from the receive floor; when nothing is there, it counts the
        whole queue (rows below the floor are not missed).

        :raises SchemaOutdated: the table is in a layout the statements cannot read (looked up
            on the first peek, as the first send or receive does).
        """
        self.check_layout(connection)
        return self._peek_from(self._on, connection)

    def purge_expired(self, connection: Connection, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete one batch of expired messages; return how many were deleted."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size {batch_size!r} must be a positive integer")
        self.probe(connection)
        statement, values = self._purge, {"n": batch_size}
        if not self._may_lock_rows and self._purge_advisory is not None:
            statement = self._purge_advisory
            values["window"] = batch_size + _ADVISORY_WINDOW
        return int(self._on(connection, (statement, statement.params(values), False)))

    def purge_all(self, connection: Connection) -> int:
        """Delete every message in the queue; return how many."""
        return int(self._on(connection, (self._purge_all, self._purge_all.params({}), False)))

    # -- the same on a DBAPI cursor (the Transport's own short transactions) ------------------
    # A cursor cannot look the table up, so these need :meth:`probe` to have run once on a
    # Connection before; they raise RuntimeError otherwise.
    def send_on_cursor(self, cursor: Any, messages: Sequence[PreparedMessage]) -> None:
        """:meth:`send` on a DBAPI cursor; :meth:`probe` must have run once before."""
        if not self._probe_ran:
            self._not_probed()
        if messages:
            self._sent(messages, self._run(cursor, self._send_args(messages)))

    def receive_on_cursor(self, cursor: Any, max_messages: int = 1) -> list[IncomingMessage]:
        """:meth:`receive` on a DBAPI cursor; :meth:`probe` must have run once before."""
        if not self._probe_ran:
            self._not_probed()
        if self.floor is not None:
            return self._receive_from_floor(self._run, cursor, max_messages)
        return self._messages(self._run(cursor, self._receive_args(max_messages), fetch=True))

    def _receive_from_floor(
        self,
        execute: Callable[[Any, tuple[sql.Statement, Any, bool], bool], Any],
        target: Any,
        max_messages: int,
    ) -> list[IncomingMessage]:
        """The receive scanning from the floor; from 0 again at once when that finds nothing.

        :param execute: :meth:`_on` (a Connection) or :meth:`_run` (a cursor), on *target*.
        """
        floor = self.floor
        assert floor is not None
        statement = self._receive_args(max_messages)[0]
        position, epoch = floor.start()
        rows = execute(target, (statement, statement.params({"floor": position}), False), True)
        if not rows and position:
            # Nothing at or above the floor: the rows left (if any) are below it.
            position = 0
            rows = execute(target, (statement, statement.params({"floor": 0}), False), True)
        messages = self._messages(rows)
        if messages:
            floor.advance(messages[0].row_version, epoch, position)
        return messages
    def peek_on_cursor(self, cursor: Any) -> int:
        """:meth:`peek` on a DBAPI cursor (no probe needed: the peek reads no optional column)."""
        return self._peek_from(self._run, cursor)

    def _peek_from(
        self, execute: Callable[[Any, tuple[sql.Statement, Any, bool], bool], Any], target: Any
    ) -> int:
        """The peek from the floor, or of the whole queue when nothing is at or above it.

        :param execute: :meth:`_on` (a Connection) or :meth:`_run` (a cursor), on *target*.
        """
        floor = self.floor
        if floor is not None and floor.position:
            statement = self._peek_from_floor
            assert statement is not None
            rows = execute(target, (statement, statement.params({"floor": floor.position}), False),
                           True)
            if rows and rows[0][0]:
                return int(rows[0][0])
        rows = execute(target, (self._peek, self._peek.params({}), False), True)
        return int(rows[0][0] or 0) if rows else 0

    def _not_probed(self) -> None:
        raise RuntimeError(
            f"queue {self.name}: call probe(connection) once before the *_on_cursor methods"
        )

    @property
    def probed(self) -> bool:
        """Whether the one-time schema probes have run (needed by the cursor methods)."""
        return self._has_recoverable is not None and self._may_lock_rows is not None

    @property
    def layout_known(self) -> bool:
        """Whether :meth:`check_layout` found the table current (it is not looked up again)."""
        return self._has_recoverable is not None

    def probe(self, connection: Connection, columns: Collection[str] | None = None) -> None:
        """Run the one-time, cached schema probes: Recoverable column, row-lock privilege.

        :param columns: the table's column names if the caller already looked them up (empty:
            no such table), so the table is not looked up a second time.
        """
        if self._probe_ran and self._has_recoverable is not None:
            return  # both ran, and the columns were not forgotten since: nothing to do
        self.check_layout(connection, columns)
        if self._may_lock_rows is None:
            self._may_lock_rows = self._check_update_privilege(connection)
        self._probe_ran = True

    def check_layout(self, connection: Connection, columns: Collection[str] | None = None) -> None:
        """Look the table's columns up once: the Recoverable column, and whether it is current.

        :param columns: the table's column names, if the caller already looked them up.
        :raises SchemaOutdated: a column the statements need is missing (a PostgreSQL table
            from before revision 0008): every statement would fail until it is migrated.
        """
        if self._has_recoverable is not None:
            return
        if columns is None:
            with db.wrap_db_errors(self.name):
                columns = db.column_names(connection, self.address)
        missing = [name for name in self._text.required_columns if name not in columns]
        if columns and missing:
            raise exceptions.SchemaOutdated(
                self.name,
                f"no column {', '.join(missing)} (NServiceBus's PostgreSQL layout)",
            )
        if columns and self._send is self._send_plain:
            self._has_recoverable = False  # the layout has no such column (PostgreSQL)
        elif columns:  # no table yet: do not cache; the statement will say QueueNotFound
            self._has_recoverable = "Recoverable" in columns
            if not self._has_recoverable:
                log.info("queue %s: no Recoverable column; sending without it", self.name)

    # -- internals -------------------------------------------------------------------------
    def _send_args(self, messages: Sequence[PreparedMessage]) -> tuple[sql.Statement, Any, bool]:
        statement = self._send if self._has_recoverable is not False else self._send_plain
        to_driver = self._id_to_driver
        rows = [
            statement.params(
                {
                    # a poison row moved on as stored keeps an Id that is not a UUID
                    "id": to_driver(message.id) if type(message.id) is _UUID else message.id,
                    "ttbr": message.ttbr_ms,
                    "headers": message.headers,
                    "body": message.body,
                }
            )
            for message in messages
        ]
        if log.isEnabledFor(logging.DEBUG):
            log.debug("queue %s: sending %d message(s)", self.name, len(rows))
        return (statement, rows, True) if len(rows) > 1 else (statement, rows[0], False)

    def _sent(self, messages: Sequence[PreparedMessage], count: int) -> None:
        if self._text.send_skips_duplicates and 0 <= count < len(messages):
            log.warning(
                "queue %s: %d of %d message(s) were already queued under the same id "
                "(a retried send); not queued twice",
                self.name,
                len(messages) - count,
                len(messages),
            )

    def _advisory(self) -> bool:
        """Whether receives take rows with advisory locks (no UPDATE privilege, PostgreSQL)."""
        return not self._may_lock_rows and self._receive_advisory is not None

    def _receive_args(self, max_messages: int) -> tuple[sql.Statement, Any, bool]:
        advisory = self._advisory()
        if type(max_messages) is int:  # not bool, whose True would find the limit 1
            args = self._receive_by_limit.get((max_messages, advisory))
            if args is not None:  # cached: a limit checked when it was rendered
                return args
        if (
            isinstance(max_messages, bool)
            or not isinstance(max_messages, int)
            or not 1 <= max_messages <= self._text.max_batch
        ):
            raise ValueError(
                f"max_messages {max_messages!r} must be an integer from 1 to {self._text.max_batch}"
            )
        return self._render_receive(max_messages, advisory)

    def _render_receive(self, limit: int, advisory: bool) -> tuple[sql.Statement, Any, bool]:
        """The receive with its row limit (an int checked by the caller) written into the text.

        A bound limit made PostgreSQL plan the statement again on every call (custom plans
        only); written in, the statement has no parameters and gets one generic plan. The first
        :data:`_CACHED_LIMITS` limits are kept, with their (empty) parameters; any other is
        rendered per call.
        """
        template, literals = self._receive_template(limit, advisory)
        statement = sql.render(template, self._dialect, self.quoted_table, literals)
        # From the floor: these parameters scan from 0 (always correct); the receive itself
        # gives the floor's position per call (_receive_from_floor).
        params = statement.params(_FROM_ZERO if self.floor is not None else _NO_PARAMETERS)
        args = (statement, params, False)
        if len(self._receive_by_limit) < _CACHED_LIMITS:
            self._receive_by_limit[(int(limit), advisory)] = args
        return args

    def _receive_template(self, limit: int, advisory: bool) -> tuple[str, dict[str, int]]:
        """The receive's template (from the floor where there is one) and its literals."""
        text = self._text
        if advisory:
            template = (
                (text.receive_without_row_locks_from_floor or text.receive_without_row_locks)
                if self.floor is not None
                else text.receive_without_row_locks
            ) or text.receive
            return template, {"n": limit, "window": limit + _ADVISORY_WINDOW}
        template = text.receive
        if self.floor is not None and text.receive_from_floor:
            template = text.receive_from_floor
        return template, {"n": limit}

    def _on(self, connection: Connection, args: tuple[sql.Statement, Any, bool],
            fetch: bool = False) -> Any:
        cursor = connections.driver_cursor(connection)
        if cursor is not None:
            try:
                return self._run(cursor, args, fetch)
            finally:
                cursor.close()
        statement, params, many = args
        with db.wrap_db_errors(self.name, on_missing_column=self._forget_columns):
            result = connection.exec_driver_sql(statement.text, params)
            if fetch:
                return result.fetchall()
            # A batch's -1 stays: the driver does not count its rows (asyncpg), not "none".
            return result.rowcount if many else max(result.rowcount, 0)

    def _run(self, cursor: Any, args: tuple[sql.Statement, Any, bool], fetch: bool = False) -> Any:
        statement, params, many = args
        try:  # not wrap_db_errors: a plain try costs nothing on the hot path
            if many:
                if self._fast_executemany:  # what SQLAlchemy's pyodbc dialect does per cursor
                    cursor.fast_executemany = True
                cursor.executemany(statement.text, params)
            else:
                cursor.execute(statement.text, params)
            if fetch:
                return cursor.fetchall()
            return cursor.rowcount if many else max(cursor.rowcount, 0)  # as in _on
        except self._dbapi_errors as error:
            raise db.translate_error(error, self.name, self._forget_columns) from error

    def _messages(self, rows: Any, ordered: bool = False) -> list[IncomingMessage]:
        if len(rows) > 1 and not ordered:
            rows = list(rows)
            rows.sort(key=_SEQUENCE)  # OUTPUT/RETURNING order is not guaranteed
        encoding, queue, build = self._text.headers_encoding, self.name, IncomingMessage.from_row
        flags = _EXPIRED
        try:
            messages = [
                build(
                    _UUID(row[0]) if type(row[0]) is str else _to_uuid(row[0]), int(row[1]),
                    row[3], row[4] if type(row[4]) is bytes else _to_bytes(row[4]),
                    flags[row[2]], queue, encoding,
                )
                for row in rows
            ]
        except _UNREADABLE:  # a column not what the table declares: each row on its own
            stored_value = self._text.stored_value
            messages = [
                row_reading.read_received(row, queue, encoding, stored_value) for row in rows
            ]
        if messages and log.isEnabledFor(logging.DEBUG):
            expired = sum(1 for message in messages if message.expired)
            log.debug("queue %s: received %d message(s), %d expired", self.name, len(messages),
                      expired)
        return messages

    def _forget_columns(self) -> None:
        self._has_recoverable = None

    def _check_update_privilege(self, connection: Connection) -> bool:
        """Whether this role may lock rows; without it, receives claim rows by advisory lock.

        FOR UPDATE needs UPDATE privilege on PostgreSQL (``SqlText.update_privilege``).
        """
        statement = self._text.update_privilege
        if statement is None:
            return True
        with db.wrap_db_errors(self.name):
            allowed = bool(
                connection.execute(
                    sa.text(statement),
                    # regclass takes the quoted name, as a value: undo the driver's %-doubling
                    {"t": self.quoted_table.replace("%%", "%")},
                ).scalar()
            )
        if not allowed:
            log.warning(
                "queue %s: this role may not UPDATE the table, so receives skip busy rows "
                "with advisory locks instead of FOR UPDATE SKIP LOCKED; grant UPDATE on one "
                "column (e.g. GRANT UPDATE (seq) ON ...) for the usual path",
                self.name,
            )
        return allowed


def _to_uuid(value: Any) -> uuid.UUID:
    if type(value) is bytes:  # SQLite: the Id's text as its bytes (see dialects.sqlite)
        return _UUID(value.decode("ascii"))
    if isinstance(value, uuid.UUID):
        return value
    if type(value) is str:
        return _UUID(value)
    raise TypeError(f"an Id of {type(value).__name__} is not a UUID")


_to_bytes = row_reading.body_bytes

