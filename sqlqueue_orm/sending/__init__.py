"""Sending beyond one transaction: the outbox, its dispatcher process and routing.

* :mod:`~sqlqueue_orm.sending.outbox`: ``OutboxData`` records (store, read, clean up).
* :mod:`~sqlqueue_orm.sending.outbox_dispatch`: the outbox's dispatching half (claim, send, mark).
* :mod:`~sqlqueue_orm.sending.outbox_records`: what a record holds, and dispatch reports.
* :mod:`~sqlqueue_orm.sending.outbox_statements`: the statements on ``OutboxData``.
* :mod:`~sqlqueue_orm.sending.dispatcher`: the process that delivers what the outbox holds.
* :mod:`~sqlqueue_orm.sending.routing`: which database each destination queue lives in.

The unit of work that stores outbox records is :class:`sqlqueue_orm.session.UnitOfWork`;
``sqlqueue outbox dispatch|cleanup`` is :mod:`sqlqueue_orm.cli.outbox`.

The names below are the documented API of sending (``docs/outbox.md`` imports them from here).
"""

from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.routing import Routing

__all__ = ["DispatcherSettings", "Outbox", "OutboxDispatcher", "Routing"]
