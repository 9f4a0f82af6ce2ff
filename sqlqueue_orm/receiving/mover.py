"""The mover: matured delayed messages into the input queue (DueDelayedMessageProcessor).

One thread per endpoint. Each run moves up to ``delayed_batch_size`` matured rows from
``<endpoint>.Delayed`` into the endpoint's input queue in one transaction (the dialect's
``DELETE ... OUTPUT`` / ``DELETE ... RETURNING``, skipping rows another mover holds, so several
instances share one table and move each message once), then reads when the next message is due.
A full batch runs again at once. Otherwise it backs off as NServiceBus 6.3+ does
(``BackOffStrategy``): 0.5 s doubling to 60 s, cut short by the next due time, or by a delayed
message this process stores (:attr:`Transport.delayed_hooks`). Failures go through a circuit
breaker: after ``critical_error_after`` seconds of them, the critical error "Failed to move
matured delayed messages to input queue".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from sqlqueue_orm import addressing
from sqlqueue_orm.receiving import circuit_breaker

if TYPE_CHECKING:
    from sqlqueue_orm.receiving.handling import Handling

log = logging.getLogger(__name__)

#: First back-off and its cap, in seconds (NServiceBus BackOffStrategy: 500 ms to 60 s).
INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 60.0
#: The loop sleeps in slices of at most this (NServiceBus: 1 s), to notice a stop.
_SLICE = 1.0


class DelayedMessageMover:
    """Moves an endpoint's matured delayed messages into its input queue (see the module).

    :param handling: the endpoint's identity and settings.
    """

    def __init__(self, handling: Handling) -> None:
        self.transport = handling.transport
        self.table = self.transport.queues.delayed_table(handling.name)
        self.queue = handling.name
        self.batch_size = handling.settings.delayed_batch_size
        #: Messages moved since the start.
        self.moved = 0
        self._stopping = threading.Event()
        self._condition = threading.Condition()
        self._earliest: float | None = None  # monotonic time a stored message is due
        self._thread: threading.Thread | None = None
        self.breaker = circuit_breaker.CircuitBreaker(
            "move matured delayed messages to input queue",
            str(self.table.address),
            handling.settings,
            self._stopping,
            handling.on_critical_error,
            handling.outage,
        )

    def start(self) -> None:
        """Start the mover thread and listen for this process's delayed sends."""
        self.transport.delayed_hooks.append(self._stored)
        self._thread = threading.Thread(
            target=self._loop, name=f"{self.queue} delayed mover", daemon=True
        )
        self._thread.start()

    def stop_moving(self) -> None:
        """Tell the thread to stop after the move in flight (returns at once)."""
        self._stopping.set()
        with self._condition:
            self._condition.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (a move in flight finishes or rolls back)."""
        self.stop_moving()
        try:
            self.transport.delayed_hooks.remove(self._stored)
        except ValueError:
            pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _stored(self, address: addressing.QueueAddress, seconds: float) -> None:
        if address != self.table.address:
            return
        due = time.monotonic() + max(0.0, seconds)
        with self._condition:
            if self._earliest is None or due < self._earliest:
                self._earliest = due
                self._condition.notify_all()

    def move_once(self) -> tuple[int, float | None]:
        """One batch in one transaction: return (moved, seconds to the next due message).

        Traced and counted by the transport's instrumentation, when it has one.
        """
        next_due: list[float | None] = [None]

        def proceed() -> int:
            with self.transport.engine.begin() as connection:
                moved = self.table.move_due(connection, self.batch_size)
                next_due[0] = self.table.seconds_to_next_due(connection)
            return moved

        hooks = self.transport.instrumentation
        moved = proceed() if hooks is None else hooks.move_delayed(self.queue, proceed)
        return moved, next_due[0]

    def _loop(self) -> None:
        backoff = INITIAL_BACKOFF / 2
        while not self._stopping.is_set():
            try:
                moved, next_due = self.move_once()
            except circuit_breaker.DATABASE_ERRORS as error:
                self.breaker.failure(error)
                continue
            except Exception:  # a bug: say so loudly, keep moving
                log.exception("queue %s: moving delayed messages failed", self.queue)
                self._stopping.wait(MAX_BACKOFF)
                continue
            self.breaker.success()
            if moved:
                self.moved += moved
                log.debug("queue %s: moved %d matured delayed message(s)", self.queue, moved)
                for hook in self.transport.sent_hooks:  # wake this process's pump now
                    hook(self.table.queue)
            if moved >= self.batch_size:
                continue  # more may be due
            backoff = min(MAX_BACKOFF, backoff * 2)
            wait = backoff
            if next_due is not None and next_due < wait:
                wait = max(0.0, next_due)
                backoff = INITIAL_BACKOFF / 2  # a better time is known: start over
            self._sleep(time.monotonic() + wait)

    def _sleep(self, until: float) -> None:
        with self._condition:
            self._earliest = None
            while not self._stopping.is_set():
                now = time.monotonic()
                target = until if self._earliest is None else min(until, self._earliest)
                if now >= target:
                    return
                self._condition.wait(min(_SLICE, target - now))
