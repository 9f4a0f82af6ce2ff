"""How an idle pump hears of other processes' sends, chosen at start for the database.

``notify=None`` (the default): wherever the database and the connection can.

* PostgreSQL, a direct connection (or a pooler in session mode): the conditional NOTIFY trigger
  (:func:`~sqlqueue_orm.receiving.wakeup.ensure_trigger`) and a
  :class:`~sqlqueue_orm.receiving.notify_waiter.NotifyWaiter`.
* PostgreSQL through a pooler in transaction or statement mode (PgBouncer): no ``LISTEN``
  and no session lock (either would stay on a pooled server connection), so polling in bursts
  as with ``wakeup="poll"``. :func:`behind_pooler` probes for it at start.
* SQLite in a file: a :class:`~sqlqueue_orm.receiving.commit_watcher.CommitWatcher`.
* Otherwise (SQL Server, SQLite in memory): polling, and in-process wake-ups.

``notify=True`` requires it (:class:`~sqlqueue_orm.exceptions.ConfigurationError` at start
where impossible); ``notify=False`` and ``wakeup="poll"`` turn it off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sqlqueue_orm import dialects, exceptions
from sqlqueue_orm.receiving import commit_watcher, notify_waiter, wakeup

if TYPE_CHECKING:
    from sqlqueue_orm import addressing
    from sqlqueue_orm.receiving.settings import EndpointSettings

log = logging.getLogger(__name__)


class PollingOnly:
    """No wake-up from other processes: the pump polls in bursts.

    For ``wakeup="poll"``, or where a pooler in transaction mode was detected.
    """

    polls = True

    def __init__(self) -> None:
        self.listening = threading.Event()

    def start(self, wake: Callable[[], None], nudge: Callable[[], None]) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""

    def idle(self, delay: float) -> float | None:
        """Sleep the pump's delay."""
        return delay

    def busy(self) -> None:
        """Nothing to do."""


def behind_pooler(engine: Engine, statements: dialects.statements.NotifyWakeup) -> str | None:
    """Why *engine*'s connections are pooled per transaction, or None when they are not.

    A session (a client connection) is then not one server connection: the server process a
    statement runs in changes between transactions. Probe: the process of one connection in
    autocommit, then another connection pinned inside a transaction, then the first again. The
    second got the first's process, or the first's changed: pooled. A pooler that refuses
    transactions (statement mode) is pooled too.
    """
    pid = sa.text(statements.backend_pid)
    try:
        with engine.connect() as first, engine.connect() as second:
            first = first.execution_options(isolation_level="AUTOCOMMIT")
            before = first.scalar(pid)
            with second.begin():
                pinned = second.scalar(pid)
                after = first.scalar(pid)
    except sa.exc.DBAPIError as error:
        if error.connection_invalidated or isinstance(error, sa.exc.InterfaceError):
            raise
        return f"a transaction was refused: {str(error.orig).splitlines()[0]}"
    if pinned == before or after != before:
        return "the server process changes between transactions"
    return None


def prepare(
    engine: Engine, address: addressing.QueueAddress, settings: EndpointSettings
) -> wakeup.IdleWaiter | None:
    """The waiter of *address*'s pump (not started), installing what it needs; None: none.

    :raises ConfigurationError: ``notify=True`` where the database or the connection cannot.
    """
    if settings.wakeup == "poll":
        return PollingOnly()
    if settings.notify is False:
        return None
    required = settings.notify is True
    support = dialects.for_dialect(engine)
    statements = support.notify_wakeup
    if statements is not None:
        pooled = behind_pooler(engine, statements)
        if pooled is not None:
            if required:
                raise exceptions.ConfigurationError(
                    f"queue {address}: notify=True needs LISTEN and session locks, which a "
                    f"pooler in transaction mode cannot keep ({pooled}); use wakeup='poll'"
                )
            log.info(
                "queue %s: connections go through a pooler in transaction mode (%s): no "
                "LISTEN, polling in bursts (wakeup='poll' says so explicitly)",
                address,
                pooled,
            )
            return PollingOnly()
        key = wakeup.ensure_trigger(engine, address, required=required)
        if key is None:
            return None
        return notify_waiter.NotifyWaiter(engine, address, key, statements)
    if support.commit_counter is not None:
        if engine.url.database in (None, "", ":memory:"):
            return None  # no other process can write to it
        return commit_watcher.CommitWatcher(engine, address, support.commit_counter)
    if required:
        raise exceptions.ConfigurationError(
            f"queue {address}: notify=True: a {support.name} database cannot wake an idle "
            "endpoint for other processes' sends; leave notify unset to poll"
        )
    return None
