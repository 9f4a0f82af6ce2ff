"""OutboxDispatcher: the process that guarantees every committed outbox message leaves.

It claims undispatched records older than a grace period (so it does not race the inline
dispatch of the unit of work that stored them), skipping rows another dispatcher holds, sends
their messages and marks them dispatched; local sends and the marks commit together. Several
dispatchers share the work. It survives the database going away (it logs, backs off up to a
cap, and carries on when the database is back), and stops cleanly on SIGTERM/SIGINT: the batch
in hand is finished and committed, then :meth:`OutboxDispatcher.run` returns.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from sqlalchemy import exc

from sqlqueue_orm import db, exceptions
from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.models.outbox import TABLE_NAME
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import DispatchReport

log = logging.getLogger(__name__)


class OutboxDispatcher:
    """Dispatches the records of one outbox, in batches, until stopped.

    :param outbox: the outbox (its transport's database, its routing to other databases).
    :param settings: batch size, polling interval, grace period, retry and back-off.
    """

    def __init__(self, outbox: Outbox, settings: DispatcherSettings | None = None) -> None:
        self.outbox = outbox
        self.settings = settings or DispatcherSettings()
        #: Everything dispatched since this dispatcher was made.
        self.total = DispatchReport()
        #: Consecutive failed attempts (0 while the database answers).
        self.failures = 0
        self._stop = threading.Event()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Ask the dispatcher to stop after the batch in hand (safe from signal handlers)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """Stop cleanly on SIGTERM and SIGINT (call from the main thread)."""

        def handle(signum: int, _frame: FrameType | None) -> None:
            log.info(
                "outbox dispatcher: %s received; stopping after this batch",
                signal.Signals(signum).name,
            )
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def dispatch_batch(self) -> DispatchReport:
        """Claim and dispatch one batch of due records (one transaction)."""
        instrumentation = self.outbox.transport.instrumentation
        if instrumentation is not None:
            report = instrumentation.dispatch(TABLE_NAME, self._dispatch_batch)
            backlog = self.outbox.backlog().pending
            sent = sum(report.messages.values())
            instrumentation.dispatched(TABLE_NAME, report.dispatched, sent, backlog)
            return report
        return self._dispatch_batch()

    def _dispatch_batch(self) -> DispatchReport:
        settings = self.settings
        report = self.outbox.dispatch_due(
            batch_size=settings.batch_size,
            grace_period=settings.grace_period,
            retry_delay=settings.retry_delay,
        )
        if report.claimed:
            self.total.add(report)
            log.info("outbox: %s", report.describe())
        return report

    def dispatch_pending(self) -> DispatchReport:
        """Dispatch batches until no record is due (``--once``); errors propagate."""
        total = DispatchReport()
        while not self.stopping:
            report = self.dispatch_batch()
            total.add(report)
            if report.claimed < self.settings.batch_size:
                break
        return total

    def run(self) -> DispatchReport:
        """Dispatch until :meth:`stop`; database failures are logged and retried with back-off.

        Returns what was dispatched. Errors that are not the database's (a bug, a bad
        setting) propagate.
        """
        settings = self.settings
        url = self.outbox.transport.engine.url.render_as_string(hide_password=True)
        log.info(
            "outbox dispatcher started on %s (batch %d, interval %gs, grace period %gs, "
            "%d route(s))",
            url,
            settings.batch_size,
            settings.interval,
            settings.grace_period,
            len(self.outbox.router.routing),
        )
        while not self.stopping:
            try:
                report = self.dispatch_batch()
            except (exceptions.SqlQueueError, exc.SQLAlchemyError) as error:
                if isinstance(error, exceptions.ConfigurationError):
                    raise
                self.failures += 1
                delay = min(
                    settings.max_backoff, settings.initial_backoff * 2 ** min(self.failures - 1, 30)
                )
                level = logging.WARNING if db.is_transient(error) else logging.ERROR
                log.log(
                    level,
                    "outbox dispatcher: database failed (%d in a row; next try in %gs): %s",
                    self.failures,
                    delay,
                    error,
                )
                self._stop.wait(delay)
                continue
            if self.failures:
                log.info("outbox dispatcher: database is back after %d failure(s)", self.failures)
                self.failures = 0
            if report.claimed < settings.batch_size:
                self._stop.wait(settings.interval)
        log.info("outbox dispatcher stopped: %s", self.total.describe())
        return self.total
