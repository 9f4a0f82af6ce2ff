"""Dispatching outbox records: send their operations, then mark them dispatched.

Dispatching a record sends its operations and marks it dispatched (``Dispatched = 1``,
``DispatchedAt`` = now, ``Operations = '[]'``, as NServiceBus does). Operations whose
destination is in the same database are sent *in the transaction that marks the record*, so
they are delivered exactly once. Operations for other databases are committed there first,
together with a row of that database's ``OutboxDelivery`` table (destination, message id) whose
primary key refuses a second delivery: after a crash between the destination's commit and the
mark, the next try finds the row and does not send the message again (it counts as
``already_delivered``). Exactly once, then, as long as the row is kept (the outbox cleanup
deletes rows older than the records it deletes).

A record that cannot be dispatched is deferred: its ``DispatchedAt`` moves to when it may be
tried again, so no dispatcher retries it before then. A record this dispatcher cannot route
(:class:`NotRouted`: a queue no route names and this database does not hold) stays due in the
table instead and is skipped by this dispatcher alone, in memory, for the retry delay: a
dispatcher that has the route sends it at once.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import logging
import shlex
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from sqlqueue_orm import db, exceptions
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.models import outbox_delivery
from sqlqueue_orm.sending.outbox_records import (
    DispatchReport,
    OutboxOperation,
    deserialize_operations,
    utc_now,
)
from sqlqueue_orm.sending.outbox_statements import (
    claim_statement,
    defer_statement,
    delivered_statement,
    mark_dispatched_statement,
    outbox_errors,
)
from sqlqueue_orm.sending.routing import Router, Routing
from sqlqueue_orm.transport import Transport

# Dispatch lines go out under the outbox's logger, as every other line of the outbox does.
log = logging.getLogger("sqlqueue_orm.sending.outbox")

#: Message ids looked up in ``OutboxDelivery`` per statement (well below every driver's limit).
_LOOKUP_CHUNK = 500
#: Records a dispatcher skips in memory for want of a route, at most (each is a parameter of
#: its claim); past them, such records are deferred in the table.
_UNROUTED_MOST = 500


class _AlreadyDelivered(Exception):
    """A delivery row of the batch exists: roll back and look before sending."""


class NotRouted(exceptions.DispatchError):
    """A destination no route names and this database does not hold: the dispatcher's gap.

    Not the record's fault: another dispatcher, one that has the route, can send it now.
    """


@dataclasses.dataclass
class _Sent:
    """Messages sent per queue, and messages skipped as already delivered."""

    messages: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    already_delivered: int = 0


class OutboxDispatch:
    """The dispatching half of :class:`~sqlqueue_orm.sending.outbox.Outbox`.

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
        #: Records this dispatcher could not route, and when it may try each again itself.
        self._unrouted: dict[str, dt.datetime] = {}
        self._record_deliveries = sa.insert(outbox_delivery.outbox_delivery_table())
        #: URLs of the databases whose OutboxDelivery table is known to exist.
        self._delivery_tables: set[str] = set()

    def dispatch(self, message_id: str) -> int | None:
        """Send the operations of record *message_id* and mark it dispatched, in one transaction.

        Returns how many messages were sent, or ``None`` when there is nothing to do: the record
        is dispatched already, absent, or being dispatched by someone else right now.

        :raises DispatchError: naming the record and queue when a send failed (the record stays
            undispatched; the dispatcher retries it).
        :raises DatabaseError: the local database failed.
        """
        with outbox_errors(), self.transport.begin() as connection:
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

    def skipped_for_route(self, *, now: dt.datetime | None = None) -> int:
        """How many records this dispatcher skips in memory for want of a route (reads no table).

        Such a record stays due in the table, where a dispatcher that has the route sends it at
        once, so :meth:`~sqlqueue_orm.sending.outbox.Outbox.waiting_for_retry` does not count
        it; this dispatcher tries it again itself once its retry delay is over.
        """
        moment = now or utc_now()
        return sum(1 for until in list(self._unrouted.values()) if until > moment)

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
        for record_id, until in list(self._unrouted.items()):
            if until <= moment:  # pop: threads sharing this outbox may prune at once
                self._unrouted.pop(record_id, None)
        skipped = list(self._unrouted)
        claim = claim_statement(limit=batch_size, skipping=bool(skipped))
        parameters: dict[str, Any] = {"cutoff": cutoff}
        if skipped:
            parameters["skipped"] = skipped
        try:
            with outbox_errors(), self.transport.begin() as connection:
                rows = connection.execute(claim, parameters).all()
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
                with outbox_errors(), self.transport.begin() as connection:
                    sent = self._dispatch_record(connection, message_id)
            except NotRouted as error:
                self._defer_unrouted(message_id, moment, delay, str(error))
                report.deferred += 1
                continue
            except exceptions.DispatchError as error:
                with outbox_errors(), self.transport.begin() as connection:
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

    def _defer_unrouted(self, message_id: str, moment: dt.datetime, delay: float, why: str) -> None:
        """Leave a record this dispatcher cannot route to one that can, at once.

        The record stays due in the table, so a dispatcher that has the route (this one after a
        restart with ``--routes``, or another) sends it on its next pass; this one skips it for
        *delay*. Past :data:`_UNROUTED_MOST` such records it is deferred in the table instead,
        as a failed send is, so the claim's list of records to skip stays bounded.
        """
        if len(self._unrouted) >= _UNROUTED_MOST:
            with outbox_errors(), self.transport.begin() as connection:
                self._defer_record(connection, message_id, moment, delay, why)
            return
        self._unrouted[message_id] = moment + dt.timedelta(seconds=delay)
        log.error(
            "outbox record %s: not dispatched: %s; this dispatcher tries it again after %gs, "
            "one that routes it at once",
            message_id,
            why,
            delay,
        )

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
                self.transport.queues.table_queue(destination).send(connection, messages)
            except exceptions.QueueNotFound as error:
                # Not "create it": a queue of another database created here would take its
                # messages for good. Which database it lives in is the routes' to say.
                raise NotRouted(
                    f"outbox {what}: queue {destination} is not routed to another database "
                    "(no route names it: a Routing, or --routes FILE of sqlqueue outbox "
                    "dispatch) and does not exist in this one"
                ) from error
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
        key = outbox_delivery.delivery_key(str(transport.queues.address(destination)))
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
                transport.queues.table_queue(destination).send(remote_connection, messages)
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
                    f"run `sqlqueue migrate --url {shlex.quote(url)}` on that database"
                ) from error
        self._delivery_tables.add(url)


def _seconds(value: dt.timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def _per_queue(sent: collections.Counter[str]) -> str:
    if not sent:
        return ""
    return " (" + ", ".join(f"{queue}: {count}" for queue, count in sorted(sent.items())) + ")"
