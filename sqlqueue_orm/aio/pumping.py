"""The receive loop of one queue of an AsyncEndpoint: one task per message in flight.

An :class:`~sqlqueue_orm.aio.AsyncEndpoint` runs one :class:`QueueLoop` per queue it receives
from (its input queue, and its instance-specific queue when it has one), each driving the
:class:`~sqlqueue_orm.receiving.pump.MessagePump` the synchronous endpoint prepared for that
queue, without the pump's threads: each message in flight is one task running the pump's mode
(:meth:`ReceiveMode.process <sqlqueue_orm.receiving.modes.base.ReceiveMode.process>`) through
SQLAlchemy's greenlet bridge. A new task starts only while fewer than the pump's concurrency
run (read at each start: the operator may change it live), so never more handlers run; after
a shrink, those begun before it finish.

The loop receives again at once while receives find messages; when one finds none it waits
``peek_delay`` seconds, or until a send to the queue wakes it: this process's, or another
writer's heard by the waiter an Endpoint would use (PostgreSQL's NOTIFY, SQLite's commit
watcher: :mod:`~sqlqueue_orm.receiving.waiting`, on its own thread). Its stop waits for the
tasks in flight, then cancels the rest: the cancellation unwinds the receive, whose
connection closes with its transaction rolled back, so the message returns to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlqueue_orm import sqlalchemy_internals
from sqlqueue_orm.receiving import tasks, wakeup
from sqlqueue_orm.receiving.circuit_breaker import DATABASE_ERRORS

if TYPE_CHECKING:
    from sqlqueue_orm.receiving.pump import MessagePump
    from sqlqueue_orm.transport import Transport

__all__ = ["QueueLoop"]

log = logging.getLogger(__name__)


class _Received(tasks.Batch):
    """One receive's ticket: the loop awaits :attr:`event`, set once the receive ran."""

    def __init__(self) -> None:
        super().__init__(1)
        self.event = asyncio.Event()
        self.found = False

    def mark(self, found: bool) -> None:
        """The receive ran (on the event loop's thread, in the bridge): *found* a message."""
        super().mark(found)
        self.found = found
        self.event.set()


class QueueLoop:
    """The receive loop of one queue, on the running event loop (see the module docstring).

    :param pump: the queue's pump, prepared and not started (its mode, counts, concurrency).
    :param transport: the synchronous core whose in-process sends wake the loop.
    :param paused: whether no receive may start now (the endpoint's or the operator's pause).
    """

    def __init__(
        self, pump: MessagePump, transport: Transport, paused: Callable[[], bool]
    ) -> None:
        self.pump = pump
        self.queue = pump.queue
        self.transport = transport
        self.paused = paused
        #: Set by a send to the queue (or a stop): an idle loop receives again.
        self.wake = asyncio.Event()
        #: Set when a handler ends or the operator changes the concurrency or the pause.
        self.place = asyncio.Event()
        #: The tasks in flight, each one receive and its handlers.
        self.in_flight: set[asyncio.Task[None]] = set()
        self.task: asyncio.Task[None] | None = None
        self._running = 0
        self._stopping = False
        self._idle: list[tasks.Worker] = []
        self._waiter: wakeup.IdleWaiter | None = None
        self._registered = False  # the waiter's idle registered the loop as waiting
        self._waker: Callable[[], None] | None = None

    def changed(self) -> None:
        """The pause or the concurrency changed: the loop looks again."""
        self.wake.set()
        self.place.set()

    def start(self, once: bool, waiter: wakeup.IdleWaiter | None) -> None:
        """Start the loop's task (*once*: it ends when the queue is drained).

        :param waiter: started already, waking :attr:`wake` for other processes' sends.
        """
        loop = asyncio.get_running_loop()
        wake = self.wake

        def waker() -> None:  # a send of this process committed, on any thread
            loop.call_soon_threadsafe(wake.set)

        self._waiter, self._waker = waiter, waker
        table = self.transport.queues.address(self.queue).table
        wakeup.local_wakeups(self.transport).register(table, waker)
        self.task = asyncio.create_task(self._loop(once), name=f"{self.queue} pump")

    async def stop_taking(self) -> None:
        """Start no receive: the loop's task ends; the handlers in flight go on."""
        self._stopping = True
        self.pump.stop_taking()  # the circuit breakers' back-off ends
        if self._waker is not None:
            table = self.transport.queues.address(self.queue).table
            wakeup.local_wakeups(self.transport).unregister(table, self._waker)
        self.wake.set()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def finish(self, limit: float) -> bool:
        """Wait up to *limit* s for the tasks in flight; cancel (roll back) the rest.

        Then the kept connections and the waiter's are given back. Return whether every task
        finished in time.
        """
        running = set(self.in_flight)
        late: set[asyncio.Task[None]] = set()
        if running:
            _, late = await asyncio.wait(running, timeout=limit)
        if late:
            log.warning(
                "queue %s: %d handler(s) still running after %.1f s; cancelling them "
                "(their receives roll back, their messages return to the queue)",
                self.queue,
                len(late),
                limit,
            )
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for worker in self._idle:
            await sqlalchemy_internals.greenlet_spawn(worker.release)
        self._idle.clear()
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            await asyncio.to_thread(waiter.stop)
        return not late

    # -- the loop ----------------------------------------------------------------------------
    async def _loop(self, once: bool) -> None:
        pump, place = self.pump, self.place
        while not self._stopping:
            if self.paused():
                await self._sleep(pump.settings.peek_delay)
                continue
            if self._running >= pump.concurrency:  # read now: a live resize changes it
                place.clear()
                await place.wait()  # a handler ends, or the operator changes something
                continue
            self._running += 1  # a free place: never more than concurrency in flight
            worker = self._idle.pop() if self._idle else pump.worker()
            received = _Received()
            receipt = pump.receipt(received, worker)
            beside = bool(self.in_flight)  # a handler then may return its message after
            task = asyncio.create_task(self._one(receipt, worker))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)
            await received.event.wait()
            if received.found:
                await self._busy()
                continue  # more may wait: receive again at once
            for idle in self._idle:  # nothing waiting: no connection kept idle
                await sqlalchemy_internals.greenlet_spawn(idle.release)
            self._idle.clear()
            if once:
                await asyncio.wait({task})  # its empty receive ends
                others = set(self.in_flight)
                if not others and not beside:
                    return  # drained: nothing found, no handler in flight since the receive
                if others:
                    await asyncio.wait(others)  # a failed one may return its message
                continue  # one more receive, with none in flight beside it
            await self._wait_idle()

    async def _wait_idle(self) -> None:
        """After an empty receive: wait ``peek_delay``, or until a send wakes the loop.

        The waiter hears other processes' sends; its first ``idle`` registers the loop as
        waiting and asks for one more receive first (a send may have come before it listened).
        Its calls may run a statement: on a thread, never on the event loop.
        """
        delay = self.pump.settings.peek_delay
        waiter = self._waiter
        if waiter is not None:
            waited = await asyncio.to_thread(waiter.idle, delay)
            if waited is None:
                self._registered = True
                return
            delay = waited
        await self._sleep(delay)

    async def _busy(self) -> None:
        """A receive found a message: the waiter need not be told of sends meanwhile."""
        waiter = self._waiter
        if self._registered and waiter is not None:
            self._registered = False
            await asyncio.to_thread(waiter.busy)

    async def _sleep(self, timeout: float) -> None:
        """Wait up to *timeout* s, or until a send (or a stop, or the operator) wakes the loop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)
        self.wake.clear()

    def _process(self, receipt: tasks.Receipt, worker: tasks.Worker) -> None:
        """The synchronous endpoint's receive of one message (run in the bridge)."""
        try:
            self.pump.mode.process(receipt, worker)
        finally:
            if not receipt.found:
                worker.release()

    async def _one(self, receipt: tasks.Receipt, worker: tasks.Worker) -> None:
        """One message in flight: its receive, its handlers, its commit (or its rollback)."""
        pump = self.pump
        failure: BaseException | None = None
        try:
            await sqlalchemy_internals.greenlet_spawn(self._process, receipt, worker)
        except DATABASE_ERRORS as error:
            failure = error
        except Exception:  # a bug: said loudly; the next message is received as usual
            log.error("queue %s: processing failed", self.queue, exc_info=True)
            pump.rewind()  # its receive rolled back: receives scan the queue from 0 again
        finally:
            receipt.received(False)  # no-op if the receive reported already
            receipt.settle()
            if receipt.found and worker.connection is not None and not self._stopping:
                self._idle.append(worker)  # its connection kept for the next receive
            elif worker.connection is not None:
                with contextlib.suppress(Exception):
                    await sqlalchemy_internals.greenlet_spawn(worker.release)
            self._running -= 1
            self.place.set()
        if failure is not None:
            pump.rewind()
            # the breaker's back-off sleeps: on a thread, this task keeping its place
            await asyncio.to_thread(pump.receive_breaker.failure, failure)
        else:
            pump.receive_breaker.success()
