"""What the dashboard reads and changes, each through the library's public API.

* queues: :meth:`Transport.list_queues` (depths from peek) and :meth:`Transport.browse`;
* the error queue: :class:`~sqlqueue_orm.recoverability.error_queue.ErrorQueue` (``list``,
  ``get``, ``retry``, ``retry_all``, ``delete``, ``count``);
* the outbox: :meth:`sqlqueue_orm.sending.outbox.Outbox.backlog`;
* delayed messages: :meth:`Transport.browse_delayed`.
"""

from __future__ import annotations

from sqlqueue_orm.recoverability.error_queue import ErrorQueue, FailedMessage
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import OutboxBacklog
from sqlqueue_orm.transport import Transport

__all__ = ["ErrorQueue", "FailedMessage", "error_queue", "outbox_backlog"]


def error_queue(transport: Transport, name: str) -> ErrorQueue:
    """The library's error queue *name* of *transport*."""
    return ErrorQueue(transport, name)


def outbox_backlog(transport: Transport) -> OutboxBacklog:
    """The outbox backlog of the transport's database (``SchemaOutdated``: no outbox table)."""
    outbox = Outbox(transport)
    try:
        return outbox.backlog()
    finally:
        outbox.close()
