"""Batches: one transaction receives up to ``batch_size`` messages and commits them together.

``batch_size`` above 1, modes TRANSACTION_SCOPE and OUTBOX only: one transaction receives up to
``batch_size`` messages with one receive statement, handles each under a SAVEPOINT of its own
(opened when its handlers first reach the database: handlers that write nothing need none) and
commits once. A failing handler rolls back its SAVEPOINT only; its immediate retries run at
once in the same transaction (each under a new SAVEPOINT, so the message keeps its row version,
its place and its ``Expires``), then it takes the delayed retry or the error queue in that
transaction. No other message of the batch is affected. A crash re-delivers at most the
uncommitted batch (``docs/scale.md``).
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlqueue_orm.queuing.delayed_table import FORWARD_DESTINATION
from sqlqueue_orm.receiving.modes.base import Receipt, ReceiveMode
from sqlqueue_orm.receiving.scope import MessageScope

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState

log = logging.getLogger(__name__)

#: Runs one message's handlers in its scope, in the batch's transaction.
BatchHandler = Callable[["Connection", "IncomingMessage", MessageScope], None]


class BatchingMode(ReceiveMode):
    """A mode that can take its messages in batches (see the module docstring)."""

    def batch_handler(self, worker: WorkerState) -> BatchHandler:
        """What runs a batched message's handlers in its scope (one lookup per batch)."""
        raise NotImplementedError

    def _process_batch(self, receipt: Receipt, worker: WorkerState) -> None:
        """Receive up to ``batch_size`` messages in one transaction; commit them together.

        Each is handled under a SAVEPOINT of its own (see the module docstring). The loop over
        the messages is the batch's hot path: a message that is not expired, poison, a matured
        delayed message or audited runs its handlers right there (:meth:`_batch_one` takes the
        others, and the retries).
        """
        settings = self.settings
        most = worker.allowance or settings.batch_size
        outcomes: list[tuple[str, IncomingMessage]] = []
        sent: list[str | addressing.QueueAddress] = []
        forwarded: list[addressing.QueueAddress] = []
        audit = settings.audit_queue is not None
        handle = self.batch_handler(worker)
        transport = self.transport
        receive = self.receiver.receive
        with receipt.connect(transport.engine) as connection:
            transaction = receipt.begin(connection)
            opened = time.monotonic()
            taken = handled = 0
            received: list[IncomingMessage] = []
            while taken < most:
                messages = receive(worker, connection, most - taken)
                if not taken:
                    receipt.received(bool(messages))
                if not messages:
                    break
                taken += len(messages)
                received += messages
                scope = MessageScope(transport, connection, sent)
                for message in messages:
                    if (
                        audit
                        or message.expired
                        or message.headers_error is not None
                        or FORWARD_DESTINATION in message.headers
                    ):
                        outcome = self._batch_one(
                            worker, connection, message, outcomes, sent, forwarded, handle
                        )
                        outcomes.append((outcome, message))
                        continue
                    try:
                        handle(connection, message, scope)
                    except Exception as error:
                        failed = self._batch_failed(connection, message, scope, error, outcomes)
                        outcome = failed or self._batch_one(  # None: retry it at once
                            worker, connection, message, outcomes, sent, forwarded, handle
                        )
                        outcomes.append((outcome, message))
                        scope = MessageScope(transport, connection, sent)
                        continue
                    handled += 1
                    if scope.opened:  # else untouched: the next message's scope
                        scope.release()
                        scope = MessageScope(transport, connection, sent)
                if time.monotonic() - opened >= settings.batch_flush:
                    break
            if not taken:
                self._nothing_handled(transaction, [])
                return
            # Every message of the batch is done with once it commits (handled, delayed, or
            # gone: the error queue, expired, poison): none of their failures is worth
            # remembering. The messages are let go of here, before the commit: a batch held
            # through the commit's WAL flush, by each worker at once, kept the collector's
            # count of new objects over its threshold, and with it young and full collections
            # of everything the process holds (all threads stopped) ran during the commits.
            forget = self.failures.remembered(received)
            counts = collections.Counter(outcome for outcome, _ in outcomes)
            del received, messages, message, outcomes
            receipt.commit(transaction)
        log.debug("queue %s: batch of %d committed", self.queue, taken)
        self._wake_destinations(sent)
        for destination in set(forwarded):
            for hook in self.transport.sent_hooks:
                hook(destination)
        self.failures.forget_many(forget)
        counts["handled"] += handled
        for outcome, count in counts.items():
            if count:
                receipt.outcome(outcome, count)

    def _batch_one(
        self,
        worker: WorkerState,
        connection: Connection,
        message: IncomingMessage,
        outcomes: list[tuple[str, IncomingMessage]],
        sent: list[str | addressing.QueueAddress],
        forwarded: list[addressing.QueueAddress],
        handle: BatchHandler,
    ) -> str:
        """Process one message of a batch in *connection*'s transaction; return its outcome.

        Its immediate retries are appended to *outcomes* as they happen, the destinations of
        its sends to *sent*, a matured delayed message's destination to *forwarded*.
        """
        if message.expired:
            self._discard_expired(message)
            return "expired"
        if message.headers_error is not None:
            self._dead_letter(connection, message)
            return "poison"
        if FORWARD_DESTINATION in message.headers:  # a matured delayed message
            worker.forwarded = None
            local = self._forward_delayed(worker, connection, message)
            if local is None:
                if worker.forwarded is not None:
                    forwarded.append(worker.forwarded)
                worker.forwarded = None
                return "handled"
            message = local
        audit = self.settings.audit_queue is not None
        while True:
            started = dt.datetime.now(dt.UTC) if audit else None
            scope = MessageScope(self.transport, connection, sent)
            try:
                handle(connection, message, scope)
                if started is not None:
                    scope.open()
                    self._audit(connection, message, started)
            except Exception as error:
                outcome = self._batch_failed(connection, message, scope, error, outcomes)
                if outcome is None:
                    continue  # an immediate retry
                return outcome
            scope.release()
            return "handled"

    def _batch_failed(
        self,
        connection: Connection,
        message: IncomingMessage,
        scope: MessageScope,
        error: Exception,
        outcomes: list[tuple[str, IncomingMessage]],
    ) -> str | None:
        """A batched message's handlers raised *error* (:meth:`_failed`).

        Return its outcome (delayed, failed), or None for an immediate retry (appended to
        *outcomes*, counted once the batch commits).
        """
        outcome = self._failed(connection, message, scope, error, in_batch=True)
        if outcome == "retried":
            outcomes.append((outcome, message))
            return None
        return outcome
