"""What the dashboard reads and changes, each through the library's public API.

* queues: :meth:`Transport.list_queues` (depths from peek) and :meth:`Transport.browse`;
* the error queue: :class:`~sqlqueue_orm.recoverability.error_queue.ErrorQueue` (``list``,
  ``get``, ``retry``, ``retry_all``, ``delete``, ``count``);
* the outbox: :meth:`sqlqueue_orm.sending.outbox.Outbox.backlog` and
  :meth:`~sqlqueue_orm.sending.outbox.Outbox.waiting_for_retry`;
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


def outbox_backlog(transport: Transport) -> tuple[OutboxBacklog, int]:
    """The outbox backlog and how many of its records a failed send deferred (reads only).

    ``SchemaOutdated``: the database has no outbox table. Only what the table holds: a record a
    dispatcher skips in memory for want of a route is due there, counted in the backlog alone
    (a dispatcher that has the route sends it at once).
    """
    outbox = Outbox(transport)
    try:
        return outbox.backlog(), outbox.waiting_for_retry()
    finally:
        outbox.close()
