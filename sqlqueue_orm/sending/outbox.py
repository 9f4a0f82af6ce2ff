"""The outbox: store outgoing messages with the business data, dispatch them after commit.

Every statement on ``OutboxData`` lives in this module (store, get, claim, mark, defer,
cleanup); the per-dialect parts come from :mod:`sqlqueue_orm.dialects`: ``FOR UPDATE SKIP
LOCKED`` on PostgreSQL, ``WITH (UPDLOCK, READPAST, ROWLOCK)`` on SQL Server (whose SQLAlchemy
dialect drops ``with_for_update()`` silently), and nothing on SQLite, where ``BEGIN
IMMEDIATE`` (set up by :func:`sqlqueue_orm.db.create_engine`) already serializes writers.

``Operations`` is a JSON array in the shape of NServiceBus SQL persistence's
``SerializableOperation`` (Newtonsoft serializes ``byte[]`` as base64)::

    [{"MessageId": "9f0c...",                                 # NServiceBus.MessageId
      "Options": {"Destination": "billing@[dbo]",             # queue address
                  "TimeToBeReceived": "00:05:00"},            # .NET TimeSpan, only with a TTBR
      "Headers": {"NServiceBus.MessageId": "9f0c...", ...},   # every header, as sent
      "Body": "eyJvcmRlciI6IDQyfQ=="}]                        # base64, or null for no body

Dispatching a record sends its operations and marks it dispatched (``Dispatched = 1``,
``DispatchedAt`` = now, ``Operations = '[]'``, as NServiceBus does). Operations whose
destination is in the same database are sent *in the transaction that marks the record*, so
they are delivered exactly once. Operations for other databases are committed there first,
together with a row of that database's ``OutboxDelivery`` table (destination, message id) whose
primary key refuses a second delivery: after a crash between the destination's commit and the
mark, the next try finds the row and does not send the message again (it counts as
``already_delivered``). Exactly once, then, as long as the row is kept (the outbox cleanup
deletes rows older than the records it deletes).
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import json
import logging
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from sqlqueue_orm import addressing, db, dialects, exceptions, headers
from sqlqueue_orm.config import CLEANUP_BATCH_SIZE
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.models import outbox_delivery
from sqlqueue_orm.models.base import Base
from sqlqueue_orm.models.outbox import TABLE_NAME, outbox_table
from sqlqueue_orm.sending.routing import Router, Routing
from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)


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

#: Message ids looked up in ``OutboxDelivery`` per statement (well below every driver's limit).
_LOOKUP_CHUNK = 500


def utc_now() -> dt.datetime:
    """Now, as the naive UTC datetime ``DispatchedAt`` holds."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


# -- operations ---------------------------------------------------------------------------
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


class _AlreadyDelivered(Exception):
    """A delivery row of the batch exists: roll back and look before sending."""


@dataclasses.dataclass
class _Sent:
    """Messages sent per queue, and messages skipped as already delivered."""

    messages: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    already_delivered: int = 0


# -- statements ---------------------------------------------------------------------------
def claim_statement(*, by_id: bool = False, limit: int = 1) -> sa.Select[Any]:
    """SELECT that locks undispatched records no one else holds (the claim, every dialect).

    ``by_id``: the record ``:message_id`` (inline dispatch, re-dispatch); otherwise up to
    *limit* records whose ``DispatchedAt`` is before ``:cutoff``, oldest first.
    """
    table = outbox_table()
    statement = sa.select(table.c.MessageId, table.c.Operations).where(
        table.c.Dispatched == sa.false()
    )
    if by_id:
        statement = statement.where(table.c.MessageId == sa.bindparam("message_id"))
    else:
        statement = (
            statement.where(table.c.DispatchedAt < sa.bindparam("cutoff", type_=sa.DateTime()))
            .order_by(table.c.DispatchedAt)
            .limit(limit)
        )
    statement = statement.with_for_update(skip_locked=True)
    for support in dialects.ALL.values():
        if support.claim_hint is not None:
            statement = statement.with_hint(table, support.claim_hint, dialect_name=support.name)
    return statement


def mark_dispatched_statement() -> sa.Update:
    """UPDATE marking ``:message_id`` dispatched at ``:now`` and emptying its Operations."""
    table = outbox_table()
    return (
        sa.update(table)
        .where(table.c.MessageId == sa.bindparam("message_id"))
        .values(
            Dispatched=sa.true(),
            DispatchedAt=sa.bindparam("now", type_=sa.DateTime()),
            Operations="[]",
        )
    )


def defer_statement() -> sa.Update:
    """UPDATE moving the undispatched ``:message_id`` to ``:until`` (after a failed dispatch)."""
    table = outbox_table()
    return (
        sa.update(table)
        .where(table.c.MessageId == sa.bindparam("message_id"), table.c.Dispatched == sa.false())
        .values(DispatchedAt=sa.bindparam("until", type_=sa.DateTime()))
    )


def cleanup_statement(dialect: sa.engine.Dialect) -> sa.Executable:
    """DELETE of up to ``:batch_size`` records dispatched before ``:cutoff``.

    SQL Server: NServiceBus's ``DELETE TOP`` with ``ROWLOCK, READPAST`` (and ``MAXDOP 1``);
    elsewhere a LIMITed sub-select (which skips locked rows on PostgreSQL).
    """
    table = outbox_table()
    return dialects.for_dialect(dialect).batched_delete(
        table,
        ("MessageId",),
        sa.and_(
            table.c.Dispatched == sa.true(),
            table.c.DispatchedAt < sa.bindparam("cutoff", type_=sa.DateTime()),
        ),
        "[Dispatched] = 1 AND [DispatchedAt] < :cutoff",
    )


def delivered_statement() -> sa.Select[Any]:
    """SELECT of the ``OutboxDelivery`` rows of ``:destination`` among the message ``:ids``."""
    table = outbox_delivery.outbox_delivery_table()
    return sa.select(table.c.MessageId, table.c.OutboxRecordId).where(
        table.c.Destination == sa.bindparam("destination"),
        table.c.MessageId.in_(sa.bindparam("ids", expanding=True)),
    )


def delivery_cleanup_statement(dialect: sa.engine.Dialect) -> sa.Executable:
    """DELETE of up to ``:batch_size`` ``OutboxDelivery`` rows delivered before ``:cutoff``.

    Batched as :func:`cleanup_statement` is: ``DELETE TOP`` on SQL Server, a LIMITed sub-select
    of the key elsewhere (skipping locked rows on PostgreSQL).
    """
    table = outbox_delivery.outbox_delivery_table()
    return dialects.for_dialect(dialect).batched_delete(
        table,
        ("Destination", "MessageId"),
        table.c.DeliveredAt < sa.bindparam("cutoff", type_=sa.DateTime()),
        "[DeliveredAt] < :cutoff",
    )


def outbox_errors() -> contextlib.AbstractContextManager[None]:
    """:func:`sqlqueue_orm.db.wrap_db_errors` for ``OutboxData``: a missing table said plainly."""
    return db.wrap_db_errors(
        label="outbox",
        missing_table=(
            TABLE_NAME,
            "the table does not exist; run `sqlqueue migrate` or Outbox.create_table()",
        ),
    )


class Outbox:
    """The outbox of one database: storing, reading, dispatching and cleaning up records.

    Long-lived: make one per application (it keeps one engine per remote database it routes to)
    and :meth:`close` it at the end.

    :param transport: the transport of the database holding ``OutboxData`` (and local queues).
    :param routing: where queues in other databases live; ``None``: every queue is local.
    """

    def __init__(self, transport: Transport, routing: Routing | None = None) -> None:
        self.transport = transport
        self.router = Router(transport, routing)
        self._claim_by_id = claim_statement(by_id=True)
        self._mark = mark_dispatched_statement()
        self._defer = defer_statement()
        self._delivered = delivered_statement()
        self._record_deliveries = sa.insert(outbox_delivery.outbox_delivery_table())
        #: URLs of the databases whose OutboxDelivery table is known to exist.
        self._delivery_tables: set[str] = set()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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

    # -- dispatching ------------------------------------------------------------------------
    def dispatch(self, message_id: str) -> int | None:
        """Send the operations of record *message_id* and mark it dispatched, in one transaction.

        Returns how many messages were sent, or ``None`` when there is nothing to do: the record
        is dispatched already, absent, or being dispatched by someone else right now.

        :raises DispatchError: naming the record and queue when a send failed (the record stays
            undispatched; the dispatcher retries it).
        :raises DatabaseError: the local database failed.
        """
        with outbox_errors(), self.transport.engine.begin() as connection:
            sent = self._dispatch_record(connection, message_id)
        if sent is not None:
            log.debug(
                "outbox record %s: dispatched %d message(s)%s",
                message_id,
                sum(sent.messages.values()),
                _per_queue(sent.messages),
            )
            return sum(sent.messages.values())
        return None

    def _dispatch_record(self, connection: Connection, message_id: str) -> _Sent | None:
        row = connection.execute(self._claim_by_id, {"message_id": message_id}).first()
        if row is None:
            return None
        operations = [(message_id, operation) for operation in self._parse(message_id, row[1])]
        sent = self._send(connection, f"record {message_id}", operations)
        connection.execute(self._mark, {"message_id": message_id, "now": utc_now()})
        return sent

    def dispatch_due(
        self,
        *,
        batch_size: int = 100,
        grace_period: dt.timedelta | float = 0,
        retry_delay: dt.timedelta | float = 30,
        now: dt.datetime | None = None,
    ) -> DispatchReport:
        """Claim up to *batch_size* records older than *grace_period*; dispatch and mark them.

        One transaction: local sends and the marks commit together. If a record cannot be
        dispatched (a queue is missing, a remote database is down, its operations cannot be
        read), the batch rolls back and is retried record by record, and each failing record is
        deferred by *retry_delay*.

        :raises DatabaseError: the local database failed (the claim rolled back; nothing was lost).
        """
        delay = _seconds(retry_delay)
        moment = now or utc_now()
        cutoff = moment - dt.timedelta(seconds=_seconds(grace_period))
        report = DispatchReport()
        try:
            with outbox_errors(), self.transport.engine.begin() as connection:
                rows = connection.execute(
                    claim_statement(limit=batch_size), {"cutoff": cutoff}
                ).all()
                report.claimed = len(rows)
                if not rows:
                    return report
                batch = [(str(row[0]), self._parse(str(row[0]), row[1])) for row in rows]
                operations = [(record, operation) for record, ops in batch for operation in ops]
                sent = self._send(connection, "batch", operations)
                report.messages.update(sent.messages)
                report.already_delivered += sent.already_delivered
                now_marked = utc_now()
                connection.execute(
                    self._mark,
                    [{"message_id": message_id, "now": now_marked} for message_id, _ in batch],
                )
                report.dispatched = len(batch)
            return report
        except exceptions.DispatchError as error:
            log.warning(
                "outbox: a batch of %d record(s) rolled back (%s); retrying them one by one",
                report.claimed,
                error,
            )
        return self._dispatch_one_by_one([str(row[0]) for row in rows], moment, delay)

    def _dispatch_one_by_one(
        self, message_ids: Sequence[str], moment: dt.datetime, delay: float
    ) -> DispatchReport:
        report = DispatchReport(claimed=len(message_ids))
        for message_id in message_ids:
            try:
                with outbox_errors(), self.transport.engine.begin() as connection:
                    sent = self._dispatch_record(connection, message_id)
            except exceptions.DispatchError as error:
                with outbox_errors(), self.transport.engine.begin() as connection:
                    self._defer_record(connection, message_id, moment, delay, str(error))
                report.deferred += 1
                continue
            if sent is not None:  # None: dispatched meanwhile, or held by another dispatcher
                report.dispatched += 1
                report.messages.update(sent.messages)
                report.already_delivered += sent.already_delivered
        return report

    def _defer_record(
        self, connection: Connection, message_id: str, moment: dt.datetime, delay: float, why: str
    ) -> None:
        until = moment + dt.timedelta(seconds=delay)
        log.error("outbox record %s: not dispatched, retried after %gs: %s", message_id, delay, why)
        connection.execute(self._defer, {"message_id": message_id, "until": until})

    def _parse(self, message_id: str, text: str) -> list[OutboxOperation]:
        try:
            return deserialize_operations(text)
        except ValueError as error:
            raise exceptions.DispatchError(
                f"outbox record {message_id!r}: Operations cannot be read: {error}"
            ) from error

    def _send(
        self, connection: Connection, what: str, operations: Sequence[tuple[str, OutboxOperation]]
    ) -> _Sent:
        """Send *operations* (record id, operation): local ones on *connection*, then remote ones.

        :raises DispatchError: naming the queue, for failures of a destination (missing queue,
            remote database down); transient failures of the local database propagate.
        """
        local: dict[str, list[PreparedMessage]] = collections.defaultdict(list)
        remote: dict[str, list[tuple[str, OutboxOperation]]] = collections.defaultdict(list)
        for record_id, operation in operations:
            if self.router.is_local(operation.destination):
                local[operation.destination].append(operation.prepare())
            else:
                remote[operation.destination].append((record_id, operation))
        sent = _Sent()
        for destination, messages in local.items():
            try:
                self.transport._table_queue(destination).send(connection, messages)
            except exceptions.SqlQueueError as error:
                if isinstance(error, exceptions.DatabaseError) and error.transient:
                    raise
                raise exceptions.DispatchError(
                    f"outbox {what}: queue {destination}: {error}"
                ) from error
            sent.messages[destination] += len(messages)
        for destination, items in remote.items():
            try:
                count, skipped = self._send_remote(destination, items)
            except exceptions.SqlQueueError as error:
                raise exceptions.DispatchError(
                    f"outbox {what}: queue {destination} in another database: {error}"
                ) from error
            if count:
                sent.messages[destination] += count
            sent.already_delivered += skipped
        return sent

    def _send_remote(
        self, destination: str, items: Sequence[tuple[str, OutboxOperation]]
    ) -> tuple[int, int]:
        """Send *items* to *destination* in another database, each at most once; (sent, skipped).

        One transaction there inserts the messages and their ``OutboxDelivery`` rows. The rows
        go first, without a look: when none of them is there (every dispatch that follows no
        crash) the primary key accepts them all and that is the whole cost. When one is there
        (a dispatcher died between the two commits, or another one got there first) the key
        refuses it, the transaction rolls back, and a second one reads which rows exist and
        sends only the others.
        """
        transport = self.router.transport_for(destination)
        self._require_delivery_table(transport, destination)
        key = outbox_delivery.delivery_key(str(transport._address(destination)))
        try:
            return self._deliver(transport, destination, key, items, look_first=False)
        except _AlreadyDelivered:
            return self._deliver(transport, destination, key, items, look_first=True)

    def _deliver(
        self,
        transport: Transport,
        destination: str,
        key: str,
        items: Sequence[tuple[str, OutboxOperation]],
        *,
        look_first: bool,
    ) -> tuple[int, int]:
        with db.wrap_db_errors(destination), transport.engine.begin() as remote_connection:
            delivered: dict[str, str] = {}
            if look_first:
                wanted = list(
                    dict.fromkeys(outbox_delivery.delivery_key(op.message_id) for _, op in items)
                )
                for start in range(0, len(wanted), _LOOKUP_CHUNK):
                    rows = remote_connection.execute(
                        self._delivered,
                        {"destination": key, "ids": wanted[start : start + _LOOKUP_CHUNK]},
                    )
                    delivered.update((str(row[0]), str(row[1])) for row in rows)
            messages: list[PreparedMessage] = []
            deliveries: list[dict[str, Any]] = []
            now = utc_now()
            for record_id, operation in items:
                message_key = outbox_delivery.delivery_key(operation.message_id)
                earlier = delivered.get(message_key)
                if earlier is not None:
                    log.log(
                        logging.INFO if earlier == record_id else logging.WARNING,
                        "queue %s: message %s of outbox record %s was delivered before (by record "
                        "%s); not sent again",
                        destination,
                        operation.message_id,
                        record_id,
                        earlier,
                    )
                    continue
                delivered[message_key] = record_id
                messages.append(operation.prepare())
                deliveries.append(
                    {
                        "Destination": key,
                        "MessageId": message_key,
                        "OutboxRecordId": outbox_delivery.delivery_key(record_id),
                        "DeliveredAt": now,
                    }
                )
            if messages:
                try:
                    remote_connection.execute(self._record_deliveries, deliveries)
                except exc.IntegrityError as error:
                    if look_first:
                        raise  # inserted by someone else since the look: a DispatchError
                    raise _AlreadyDelivered from error
                transport._table_queue(destination).send(remote_connection, messages)
        return len(messages), len(items) - len(messages)

    def _require_delivery_table(self, transport: Transport, destination: str) -> None:
        """Create ``OutboxDelivery`` in *transport*'s database unless it is known to exist."""
        url = transport.engine.url.render_as_string(hide_password=True)
        if url in self._delivery_tables:
            return
        try:
            with db.wrap_db_errors(destination), transport.engine.begin() as connection:
                outbox_delivery.outbox_delivery_table().create(connection, checkfirst=True)
        except exceptions.SqlQueueError as error:
            # Another dispatcher may have created it at the same moment: look again.
            with db.wrap_db_errors(destination), transport.engine.connect() as connection:
                exists = sa.inspect(connection).has_table(outbox_delivery.TABLE_NAME)
            if not exists:
                raise exceptions.DispatchError(
                    f"table {outbox_delivery.TABLE_NAME} cannot be created in {url}: {error}; "
                    "run `sqlqueue migrate` on that database"
                ) from error
        self._delivery_tables.add(url)

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


def _seconds(value: dt.timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def _per_queue(sent: collections.Counter[str]) -> str:
    if not sent:
        return ""
    return " (" + ", ".join(f"{queue}: {count}" for queue, count in sorted(sent.items())) + ")"
