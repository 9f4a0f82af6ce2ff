"""The retry decision (immediate, then delayed retries) and what a matured delayed message becomes.

Recoverability as NServiceBus Core's default policy: a failed message is retried at once up to
``immediate_retries`` times (counted in memory per native id, as ``FailureInfoStorage``: a
restart starts over); then sent back through native delayed delivery up to ``delayed_retries``
times, the *n*-th after ``n * delayed_retry_increase`` seconds, carrying
``NServiceBus.Retries: n`` and ``NServiceBus.Retries.Timestamp`` (the wire time format) so the
count survives restarts; then it goes to the error queue. A failure no retry can fix (no
handler, a body the model cannot read) goes to the error queue at once.

A message moved out of the delayed table carries ``NServiceBus.SqlServer.ForwardDestination``:
:func:`arrived` strips it and forwards the message there, or hands it back for local handling
when it names this endpoint (NServiceBus ``ProcessStrategy.TryHandleDelayedMessage``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import TYPE_CHECKING

from sqlqueue_orm import addressing, db, exceptions, headers
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage, PreparedMessage
from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.receiving.settings import EndpointSettings
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Delayed retries the message has had (NServiceBus ``Headers.DelayedRetries``).
RETRIES = "NServiceBus.Retries"
#: When the last delayed retry was scheduled (``Headers.DelayedRetriesTimestamp``).
RETRIES_TIMESTAMP = "NServiceBus.Retries.Timestamp"

IMMEDIATE = "immediate"
DELAYED = "delayed"
ERROR_QUEUE = "error"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do with a failed message: ``immediate``, ``delayed`` (after *delay*) or ``error``."""

    action: str
    delay: float = 0.0


def delayed_retries_done(message: IncomingMessage) -> int:
    """The ``NServiceBus.Retries`` count of *message* (0 when missing or unreadable)."""
    text = message.headers.get(RETRIES)
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0


def decide(
    settings: EndpointSettings, message: IncomingMessage, attempts: int, permanent: bool
) -> Decision:
    """The retry decision for *message* after its *attempts*-th failure in this process."""
    if permanent:
        return Decision(ERROR_QUEUE)
    if attempts <= settings.immediate_retries:
        return Decision(IMMEDIATE)
    done = delayed_retries_done(message)
    if settings.delayed_delivery and done < settings.delayed_retries:
        return Decision(DELAYED, (done + 1) * settings.delayed_retry_increase)
    return Decision(ERROR_QUEUE)


def retry_later(
    transport: Transport,
    endpoint: str,
    connection: Connection,
    message: IncomingMessage,
    decision: Decision,
    queue: str | addressing.QueueAddress | None = None,
) -> None:
    """Send *message* back to *queue* through *endpoint*'s delayed table, in *connection*'s tx.

    *queue* is where it failed (default: the endpoint's input queue, named *endpoint*): an
    instance-specific queue gets its own messages back.
    """
    done = delayed_retries_done(message) + 1
    retried = {
        **message.headers,
        RETRIES: str(done),
        RETRIES_TIMESTAMP: headers.format_time(dt.datetime.now(dt.UTC)),
    }
    outgoing = OutgoingMessage(message.body, retried, message.message_id)
    transport.send(
        endpoint if queue is None else queue,
        outgoing,
        connection=connection,
        delay=decision.delay,
        endpoint=endpoint,
    )
    log.warning(
        "queue %s: message %s failed its immediate retries; delayed retry %d in %g s",
        endpoint,
        message.message_id,
        done,
        decision.delay,
    )


def arrived(
    transport: Transport,
    endpoint: str,
    connection: Connection,
    message: IncomingMessage,
    queue: str | addressing.QueueAddress | None = None,
) -> tuple[IncomingMessage, addressing.QueueAddress | None]:
    """A received message without its ForwardDestination, and where it was forwarded.

    No such header, or one naming *queue* (where it was received; default the input queue of
    the endpoint named *endpoint*): ``(message without it, None)``, to handle here. Another
    destination: the message is sent there in *connection*'s transaction (same native id,
    headers and body) and ``(message, destination)`` comes back.

    :raises QueueNotFound: the destination does not exist (the caller moves the message to the
        error queue); the send ran inside a SAVEPOINT, so the transaction stays usable.
    """
    if FORWARD_DESTINATION not in message.headers:
        return message, None
    kept = {key: value for key, value in message.headers.items() if key != FORWARD_DESTINATION}
    stripped = dataclasses.replace(message, headers=kept)
    target = message.headers[FORWARD_DESTINATION] or ""
    try:
        destination = transport.queues.address(target)
    except exceptions.SqlQueueError:
        log.error(
            "queue %s: delayed message %s names destination %r, which is not an address; "
            "handling it here",
            endpoint,
            message.message_id,
            target,
        )
        return stripped, None
    # Compared as written (with the schema on PostgreSQL): "sales" and "public"."sales" are one.
    if transport.queues.qualified(destination) == transport.queues.qualified(
        endpoint if queue is None else queue
    ):
        return stripped, None
    # Headers, body and native id exactly as they are (no TimeSent or MessageId added).
    row = PreparedMessage(
        stripped.id, stripped.message_id, headers.serialize(kept), stripped.body, None
    )
    with db.wrap_db_errors(str(destination)), connection.begin_nested():
        transport.queues.table_queue(destination).send(connection, [row])
    log.debug(
        "queue %s: delayed message %s forwarded to %s",
        endpoint,
        message.message_id,
        destination,
    )
    return stripped, destination
