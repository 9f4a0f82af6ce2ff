"""The message pump: peek, then receive tasks on worker threads, as NServiceBus's MessageReceiver.

The loop thread peeks (the estimated count, cheap at any queue size). Nothing waiting: it
sleeps ``peek_delay`` (or until woken) and peeks again; with ``wakeup="poll"`` only
``burst_delay`` while a burst lasts (``burst_window`` seconds after a peek found messages).
Otherwise it starts ``min(count, peek_batch_size)`` receive tasks, each waiting for a free
worker (NServiceBus starts *count* tasks, each behind its concurrency semaphore), and waits
until each has run its receive (NServiceBus 9 waits the same way, so it does not peek over rows
its own tasks are taking); a receive that finds nothing cancels the rest and the loop peeks
again at once. There are ``concurrency`` worker threads, and a worker begins a receive only
while the pump has no more workers than its concurrency, decided under the lock that counts
the receive: after a shrink (:meth:`MessagePump.resize`) each worker too
many ends after its message instead of taking another, and a grow starts only the workers
missing while those still finish. So no more than ``concurrency`` messages are handled at once;
a shrink waits for the messages begun before it.

Latency (docs/endpoint.md, "Wake-up and latency"): a send's wake-up (in-process or NOTIFY)
starts one receive at once, without a peek first. Where the peek counts rows whose receive
has not committed (PostgreSQL, SQLite), the rows this pump's handlers hold are subtracted, and
a peek that counted only those sleeps until a send wakes the pump or a handler that held a row
ends (its row is gone, or back after a rollback). A receive that finds nothing although the
peek counted rows (another process holds them, or flow control refused) is followed by a pause
of at most :data:`EMPTY_RECEIVE_PAUSE`, not by a peek at once: on PostgreSQL that spun peeks
and receives for as long as any handler ran.

Each worker thread has a :class:`~sqlqueue_orm.receiving.tasks.Worker`, handed with a
:class:`~sqlqueue_orm.receiving.tasks.Receipt` to the mode's ``process`` on every receive; the
connection a worker keeps between receives, and when it gives it back, are
:mod:`~sqlqueue_orm.receiving.tasks`'s.

Peek and receive each have a circuit breaker
(:class:`~sqlqueue_orm.receiving.circuit_breaker.CircuitBreaker`); while the receive breaker
is open, one receive is tried at a time.

Where a receive happens: :meth:`MessagePump._work_with`, each worker thread's loop, which
takes a receive task and hands it to the mode.

:meth:`MessagePump.stop` stops taking messages and waits for the handlers in flight and for the
workers' kept connections; handlers still running at the deadline are abandoned: their
connection is closed under them, so the database rolls their receive back and the message
returns to the queue. It returns True only with no handler running and every connection back
in the pool; a worker decides to start a receive under the lock that counts it, so none begins
after a stop that saw none.
"""

from __future__ import annotations

import itertools
import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING

from sqlqueue_orm import dialects
from sqlqueue_orm.receiving import tasks, wakeup
from sqlqueue_orm.receiving.circuit_breaker import DATABASE_ERRORS, CircuitBreaker
from sqlqueue_orm.receiving.stats import PumpStats

if TYPE_CHECKING:
    from sqlqueue_orm import addressing
    from sqlqueue_orm.receiving.handling import Handling
    from sqlqueue_orm.receiving.modes.base import ReceiveMode

__all__ = ["EMPTY_RECEIVE_PAUSE", "MessagePump", "PumpStats"]

log = logging.getLogger(__name__)

_OUTCOMES = ("handled", "failed", "retried", "delayed", "expired", "poison")
#: Most receive tasks started after one peek (a peek of a huge queue is re-done after them).
_MAX_TICKETS = 10_000
#: Longest pause (seconds) after a receive found nothing that its peek had counted; a send's
#: wake-up or a handler of the pump ending cuts it short.
EMPTY_RECEIVE_PAUSE = 0.05
#: Longest wait (seconds, after :data:`~.tasks.LINGER`) of a stop for idle workers to give
#: their connections back: no handler runs there, only a scheduler starving a thread delays it.
_RELEASE_WAIT = 2.0
#: Numbers the worker threads a resize starts.
_resized = itertools.count()


class MessagePump:
    """The peek loop and the worker threads of one endpoint (see the module docstring)."""

    def __init__(
        self,
        handling: Handling,
        mode: ReceiveMode,
        concurrency: int | None = None,
    ) -> None:
        self.handling = handling
        self.mode = mode
        #: The queue pumped: the mode's (the input queue, or the instance-specific one).
        self.queue = mode.queue
        self._table_queue = mode.receiver.table_queue
        self.settings = handling.settings
        #: Worker threads, so messages handled at once at most.
        self.concurrency = self.settings.concurrency if concurrency is None else concurrency
        self.stats = PumpStats()
        #: Paused (receiving/control.py): no peek, no receive; handlers in flight finish.
        self.paused = False
        #: Set once a peek and then a receive found nothing with no handler running
        #: (``sqlqueue run --once``); never cleared.
        self.drained = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._wake = threading.Event()
        #: Set with ``_wake`` by :meth:`wake` (a send), not by a handler ending.
        self._sent = False
        #: The loop sleeps: a handler that held a row ending wakes it.
        self._pausing = False
        #: Handlers that held a row and ended (under ``_condition``).
        self._ended = 0
        #: Whether the dialect's peek counts rows whose receive has not committed.
        self._peek_counts_held_rows = False
        self._tickets: queue_module.SimpleQueue[tasks.Batch | tasks.Shrunk | None] = (
            queue_module.SimpleQueue()
        )
        #: Worker threads started and not ended or ending (under ``_condition``): one counts
        #: itself out as it decides to end, so two ending at once never both end for one too many.
        self._workers = 0
        #: Kept connections the workers hold (under ``_condition``; see :class:`~.tasks.Worker`).
        self._held = 0
        self._condition = threading.Condition()
        self._busy = 0
        self._active: set[tasks.Receipt] = set()
        #: :meth:`hurry` was called: a stop abandons the handlers without waiting.
        self._hurried = False
        self._threads: list[threading.Thread] = []
        self._loop_thread: threading.Thread | None = None
        self._listener: wakeup.IdleWaiter | None = None
        self._local_wakeups: wakeup.LocalWakeups | None = None
        self._address: addressing.QueueAddress | None = None
        #: When a peek last found messages (monotonic seconds): a burst lasts from there.
        self._last_found = float("-inf")
        self.peek_breaker = CircuitBreaker(
            "peek", str(self.queue), self.settings, self._stopping, handling.on_critical_error,
            handling.outage,
        )
        self.receive_breaker = CircuitBreaker(
            "receive", str(self.queue), self.settings, self._stopping, handling.on_critical_error,
            handling.outage,
        )

    @property
    def running(self) -> bool:
        """Whether the pump was started and has not stopped."""
        return self._loop_thread is not None and not self._stopped.is_set()

    def set_paused(self, paused: bool) -> None:
        """Pause the pump (no peek, no receive; handlers in flight finish) or resume it at once."""
        with self._condition:
            self.paused = paused
            self._condition.notify_all()  # the loop waits on it while paused

    def resize(self, concurrency: int) -> None:
        """Run the pump with *concurrency* worker threads (before or after it started).

        Growing starts the threads missing at once; workers a shrink is ending count until they
        end, so none starts beside them beyond *concurrency*. Shrinking lowers the limit the
        workers check as each counts its next receive (:meth:`_retire`): a worker too many ends
        there, after the message it is handling, instead of beginning another. A
        :data:`~.tasks.SHRUNK` ticket per worker too many ends the idle ones at once.
        """
        with self._condition:
            if self._stopping.is_set() or concurrency == self.concurrency:
                return
            self.concurrency = concurrency
            if self._loop_thread is not None:
                threads = [thread for thread in self._threads if thread.is_alive()]
                while self._workers < concurrency:
                    thread = threading.Thread(
                        target=self._work,
                        name=f"{self.queue} worker +{next(_resized)}",
                        daemon=True,
                    )
                    self._workers += 1
                    thread.start()
                    threads.append(thread)
                for _ in range(self._workers - concurrency):
                    self._tickets.put(tasks.SHRUNK)
                self._threads = threads  # a new list: a stop's loop may be iterating the old one
            self._condition.notify_all()

    def start(self, waiter: wakeup.IdleWaiter | None = None) -> None:
        """Start the worker threads and the peek loop (all daemon threads), and the wake-ups.

        :param waiter: hears other processes' sends while idle (:mod:`~.receiving.waiting`).
        """
        transport = self.handling.transport
        self._peek_counts_held_rows = dialects.for_dialect(
            transport.engine
        ).peek_counts_held_rows
        self._address = transport.queues.address(self.queue)
        self._local_wakeups = wakeup.local_wakeups(transport)
        self._local_wakeups.register(self._address.table, self.wake)
        self._listener = waiter
        if waiter is not None:
            waiter.start(self.wake, self._wake.set)
        with self._condition:  # a resize sees every worker counted, or the pump not started
            for number in range(self.concurrency):
                thread = threading.Thread(
                    target=self._work, name=f"{self.queue} worker {number}", daemon=True
                )
                self._workers += 1
                thread.start()
                self._threads.append(thread)
            loop = threading.Thread(target=self._loop, name=f"{self.queue} pump", daemon=True)
            self._loop_thread = loop
        loop.start()

    def wake(self) -> None:
        """Receive now instead of at the end of the peek delay (a message was sent)."""
        self._sent = True
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            sent = False  # a send woke the pump: receive at once, no peek first
            while not self._stopping.is_set():
                self._wait_for_a_free_worker()
                if self._stopping.is_set():
                    break
                ended = self._ended  # handlers that held a row and ended, before this peek
                woken, sent = sent, False
                if woken:
                    # A committed send woke us: the peek would only say "at least one",
                    # so one receive goes at once (a round trip less before the handler);
                    # the peek after it finds whatever else is waiting.
                    count = 1
                else:
                    try:
                        count = self.handling.transport.peek(self.queue)
                    except DATABASE_ERRORS as error:
                        self.peek_breaker.failure(error)
                        continue
                    self.peek_breaker.success()
                    self.stats.peeks += 1
                    if count <= 0:
                        if not self.drained.is_set() and self._confirm_empty():
                            continue  # the receive found what the peek did not count: go on
                        sent = self._sleep(self._idle_delay(), ended)
                        continue
                    held = self._held_rows()
                    if count <= held:
                        # Only rows our handlers hold: nothing to take until a send wakes
                        # the pump or a handler ends (its row gone, or back after a rollback).
                        sent = self._sleep(self._idle_delay(), ended)
                        continue
                    count -= held
                    self._last_found = time.monotonic()
                size = self._tickets_for(count)
                batch = tasks.Batch(size)
                for _ in range(size):
                    self._tickets.put(batch)
                if self._listener is not None:  # after the tickets: adds no latency
                    self._listener.busy()
                self._wait_for(batch)
                if batch.empty and woken:
                    # The message announced was taken already (this pump's last peek found it
                    # before its notification came, or a competitor did): peek, and wait as
                    # idle, registered, rather than pause deaf to the next send.
                    continue
                if batch.empty:
                    # A receive found nothing although the peek counted rows: they are held
                    # by receives in flight (PostgreSQL's peek sees a row until the receive
                    # commits) or refused by flow control. Peeking again at once would spin
                    # peek and receive for as long as a handler runs; pause instead, until a
                    # send wakes the pump or one of its handlers ends (its row is gone, or
                    # back after a rollback), at most EMPTY_RECEIVE_PAUSE.
                    sent = self._sleep(min(self._idle_delay(), EMPTY_RECEIVE_PAUSE), ended, False)
        except Exception:  # a bug: say so loudly rather than die silently
            log.critical("queue %s: the pump loop failed", self.queue, exc_info=True)
        finally:
            with self._condition:  # a resize in progress (it holds the lock) counted too
                for _ in self._threads:
                    self._tickets.put(None)

    def _wait_for_a_free_worker(self) -> None:
        """Wait while every worker is busy or the pump is paused, until it stops."""
        with self._condition:
            while (self._busy >= self.concurrency or self.paused) and not self._stopping.is_set():
                self._condition.wait(0.5)

    def _wait_for(self, batch: tasks.Batch) -> None:
        """Wait until every ticket of *batch* is done, or the pump stops."""
        while not batch.done.wait(0.5):
            if self._stopping.is_set():
                break

    def _tickets_for(self, count: int) -> int:
        """How many receive tickets to hand out for *count* messages waiting.

        Up to *count* receive tasks, each waiting for a free worker (NServiceBus starts that
        many, each behind its concurrency semaphore): a worker that handled one message takes
        the next ticket without a peek in between. A batched receive takes up to batch_size
        messages per ticket; an armed receive breaker lets one through at a time.
        """
        if self.receive_breaker.armed:
            return 1
        size = min(count, self.settings.peek_batch_size or count, _MAX_TICKETS)
        return -(-size // self.settings.batch_size)

    def _held_rows(self) -> int:
        """Rows this pump's handlers hold that the peek counted (0 where it does not count them).

        A batched receive holds up to ``batch_size`` rows per handler: not subtracted (a peek
        overestimated costs one empty receive, not a stall).
        """
        if not self._peek_counts_held_rows or self.settings.batch_size > 1:
            return 0
        with self._condition:
            return sum(1 for receipt in self._active if receipt.holding)

    def _sleep(self, timeout: float, ended: int, idle: bool = True) -> bool:
        """Wait up to *timeout* s; return whether a send woke the pump.

        A handler that held a row and ends wakes it too (its row is gone, or back in the queue
        after a rollback), and if one ended since *ended* (:attr:`_ended` before the peek)
        this returns at once. *idle*: the waiter may register first, then the loop peeks again.
        """
        if idle and self._listener is not None:
            waited = self._listener.idle(timeout)
            if waited is None:
                return False  # registered as waiting: one more peek, then the sleep
            timeout = waited
        with self._condition:
            if self._ended != ended:
                return False
            self._pausing = True
        self._wake.wait(timeout)
        self._wake.clear()
        with self._condition:
            self._pausing = False
        sent, self._sent = self._sent, False
        return sent

    def _idle_delay(self) -> float:
        """Seconds to sleep after an empty peek: ``burst_delay`` in a burst, else ``peek_delay``.

        Only with ``wakeup="poll"`` (or a pooler detected): there no notification ends the
        sleep early, so while messages keep arriving the pump peeks again soon.
        """
        settings = self.settings
        polls = settings.wakeup == "poll" or (self._listener is not None and self._listener.polls)
        if polls and time.monotonic() - self._last_found < settings.burst_window:
            return settings.burst_delay
        return settings.peek_delay

    def _confirm_empty(self) -> bool:
        """After an empty peek, until ``drained`` is set: one receive, to be sure it is empty.

        A peek is an estimate (SQL Server's skips rows others hold, which a rollback returns),
        so an empty one alone does not prove the queue drained. ``drained`` is set when this
        receive also finds nothing, no handler is in flight and the receive did not fail.
        Return whether the receive found a message (then the loop peeks again at once).
        """
        with self._condition:
            if self._busy:
                return False
        batch = tasks.Batch(1)
        self._tickets.put(batch)
        while not batch.done.wait(0.5):
            if self._stopping.is_set():
                return False
        if not batch.empty:
            return True
        with self._condition:
            while self._busy and not self._stopping.is_set():
                self._condition.wait(0.5)
            if not self._busy and not self.receive_breaker.armed:
                self.drained.set()
        return False

    def worker(self) -> tasks.Worker:
        """A new worker whose kept connection this pump counts (its stop waits for it)."""
        return tasks.Worker(self.queue, self._holding)

    def receipt(self, batch: tasks.Batch, worker: tasks.Worker) -> tasks.Receipt:
        """*worker*'s receipt of one receive of *batch*, its outcomes counted in :attr:`stats`."""
        return tasks.Receipt(batch, worker, self._count)

    def _work(self) -> None:
        worker = self.worker()
        retired = False
        try:
            retired = self._work_with(worker)
        finally:
            worker.release()
            if not retired:
                with self._condition:
                    self._workers -= 1

    def _retire(self) -> bool:
        """Whether this worker is one too many after a shrink; if so it is counted out now.

        Called under ``_condition``.
        """
        if self._workers <= self.concurrency:
            return False
        self._workers -= 1
        return True

    def _work_with(self, worker: tasks.Worker) -> bool:
        """Take receive tasks until a stop (return False) or a shrink (True: counted out)."""
        tickets = self._tickets
        while True:
            try:
                batch = tickets.get(block=False)
            except queue_module.Empty:
                batch = self._next_ticket(worker)
            if batch is None:
                return False
            if isinstance(batch, tasks.Shrunk):
                with self._condition:
                    if self._retire():
                        return True
                continue
            receipt = self.receipt(batch, worker)
            with self._condition:
                # decided as the receive is counted: a stop that saw none running and no
                # connection held has returned, and no receive may begin after it; and a
                # worker too many after a shrink ends here, so never more than concurrency run
                cancelled = batch.empty or self._stopping.is_set() or self.paused
                retired = not cancelled and self._retire()
                if not cancelled and not retired:
                    self._busy += 1
                    self._active.add(receipt)
            if retired:
                tickets.put(batch)  # the task is another worker's
                return True
            if cancelled:  # a sibling found nothing, stopping or paused
                if self._stopping.is_set():
                    worker.release()  # now, not after passing over the tasks still queued
                batch.mark(True)
                continue
            self._process(receipt, worker)
            if self._stopping.is_set():
                worker.release()  # before the stop can see this worker idle
            with self._condition:
                self._busy -= 1
                self._active.discard(receipt)
                self._condition.notify_all()
                if receipt.found:  # its row is gone, or back in the queue: peek again
                    self._ended += 1
                    if self._pausing:
                        self._wake.set()

    def _process(self, receipt: tasks.Receipt, worker: tasks.Worker) -> None:
        """Receive and process under *receipt*, and tell the receive breaker how it went."""
        failure: BaseException | None = None
        raised = False
        try:
            self.mode.process(receipt, worker)
        except DATABASE_ERRORS as error:
            failure = error
            raised = True
        except Exception as error:
            raised = True
            if receipt.abandoned:
                log.info("queue %s: an abandoned handler ended: %s", self.queue, error)
            else:
                log.error("queue %s: processing failed", self.queue, exc_info=True)
        finally:
            receipt.received(False)  # no-op if the receive reported already
            receipt.settle()
        if raised:
            # its transaction rolled back, and which messages it held is not known here:
            # receives scan the queue from 0 again (docs/scale.md, the receive floor)
            self.rewind()
        if failure is not None and not receipt.abandoned:
            self.receive_breaker.failure(failure)
        elif failure is None:
            self.receive_breaker.success()

    def _next_ticket(self, worker: tasks.Worker) -> tasks.Batch | tasks.Shrunk | None:
        """The next receive task when none is waiting (None: stop).

        A worker holding a connection keeps it for up to :data:`~.tasks.LINGER` seconds first (not
        once the pump is stopping), then gives it back to the pool and waits holding none.
        """
        tickets = self._tickets
        if worker.connection is not None and not self._stopping.is_set():
            try:
                return tickets.get(timeout=tasks.LINGER)
            except queue_module.Empty:
                pass
        worker.release()  # nothing to run: an idle worker holds no connection
        return tickets.get()

    def _holding(self, change: int) -> None:
        """A worker took (1) or gave back (-1) a kept connection."""
        with self._condition:
            self._held += change
            if not self._held:
                self._condition.notify_all()

    def rewind(self) -> None:
        """Receives scan the queue from its start again (a receive rolled back, rows unknown).

        See docs/scale.md, the receive floor.
        """
        floor = self._table_queue.floor
        if floor is not None:
            floor.reset()

    def _count(self, outcome: str | None, count: int = 1, in_flight: int = 0) -> None:
        """Count *count* messages of one *outcome* (a batch counts each outcome at once).

        *in_flight*: a receive took messages (1) or is done with them (-1), in the same step,
        so ``received`` (done with, and in flight) never counts a message twice or not at all.
        """
        with self._condition:
            if outcome in _OUTCOMES:
                setattr(self.stats, outcome, getattr(self.stats, outcome) + count)
            if in_flight:
                stats = self.stats
                stats.in_flight += in_flight
                stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        instrumentation = self.handling.instrumentation
        if outcome is not None and instrumentation is not None:
            queue = self._table_queue.name
            for _ in range(count):
                instrumentation.outcome(queue, outcome)

    # -- stopping ---------------------------------------------------------------------------
    def stop_taking(self) -> None:
        """Take no more messages (the handlers in flight go on); :meth:`stop` waits for them."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self._local_wakeups is not None and self._address is not None:
            self._local_wakeups.unregister(self._address.table, self.wake)
        if self._listener is not None:
            self._listener.stop()

    def hurry(self) -> None:
        """End a stop's wait for the handlers now (before or during it): abandon them."""
        with self._condition:
            self._hurried = True
            self._condition.notify_all()

    def stop(self, timeout: float) -> bool:
        """Stop taking messages; wait up to *timeout* s for handlers, abandon the rest.

        Return True when every handler finished and no worker holds a connection.
        """
        if self._stopped.is_set():
            return True
        self.stop_taking()
        began = time.monotonic()
        deadline = began + timeout
        with self._condition:
            # the workers' kept connections too: back in the pool when stop() returns
            while (
                (self._busy or self._held) and time.monotonic() < deadline and not self._hurried
            ):
                self._condition.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            # a worker that went idle just before the stop gives its connection back within
            # LINGER (no handler runs there), even when the deadline is shorter
            lingering = time.monotonic() + tasks.LINGER + _RELEASE_WAIT
            while not self._busy and self._held and time.monotonic() < lingering:
                self._condition.wait(max(0.0, lingering - time.monotonic()))
            idle = self._busy == 0
            held = self._held
            abandoned = list(self._active)
        if idle and held:
            log.warning("queue %s: %d connection(s) still held by idle workers", self.queue, held)
        if not idle:
            log.warning(
                "queue %s: %d handler(s) still running after %.1f s; rolling them back "
                "(their messages return to the queue)",
                self.queue,
                len(abandoned),
                time.monotonic() - began,
            )
            for receipt in abandoned:
                receipt.abandon()
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=1.0)
        self._stopped.set()
        log.info("queue %s: endpoint stopped (%d handled)", self.queue, self.stats.handled)
        return idle and not held  # True: no handler runs, no worker holds a connection

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped; return whether it is."""
        return self._stopped.wait(timeout)

    # -- in flight, for the stats -----------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Receives and handlers running now."""
        return self._busy
