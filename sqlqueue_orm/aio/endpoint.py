"""AsyncEndpoint: an endpoint whose handlers are coroutines, on one event loop.

::

    endpoint = AsyncEndpoint("sales", "postgresql+asyncpg://app@db/shop", concurrency=8)

    @endpoint.handle(PlaceOrder)
    async def place(order: PlaceOrder, context: AsyncHandlerContext) -> None:
        context.session.add(Order(id=order.id))      # an AsyncSession, in the receive's tx
        await context.reply(OrderPlaced(id=order.id))

    await endpoint.run()      # until SIGTERM / SIGINT / await endpoint.stop()

One core: each message in flight is one task running the synchronous endpoint's own receive
(:meth:`ReceiveMode.process <sqlqueue_orm.receiving.modes.base.ReceiveMode.process>`: the
receive, the transaction mode, the retries, the error queue, the audit copy, the counts) on
the asyncio engine's connections through SQLAlchemy's greenlet bridge; where the mode runs the
handlers, the handler coroutine is awaited on the event loop, with an ``AsyncSession`` over
the session the mode gives (in TRANSACTION_SCOPE: inside the receive's transaction). A new
task starts only while fewer than the concurrency in force run (read at each start: the
operator may change it live), so never more handlers run; after a shrink, those begun before
it finish.

The loop receives again at once while receives find messages; when one finds none it waits
``peek_delay`` seconds, or until a send to the queue wakes it: this process's, or another
writer's heard by the waiter an Endpoint would use (PostgreSQL's NOTIFY, SQLite's commit
watcher: :mod:`~sqlqueue_orm.receiving.waiting`, on its own thread). A stop waits up
to ``shutdown_timeout`` for the tasks in flight, then cancels the rest: the cancellation
unwinds the receive, whose connection closes with its transaction rolled back, so the message
returns to the queue.

For the operator, the synchronous endpoint's own threads run beside the loop, each on its own
connection of a synchronous engine of the database (:meth:`AsyncTransport.for_threads`): the
:class:`~sqlqueue_orm.receiving.control.ControlPoller` (``sqlqueue control``'s pause, resume
and concurrency reach the loop through :class:`_Controlled`) and, with ``heartbeat_interval``,
the :class:`~sqlqueue_orm.receiving.health.HealthWriter` (the heartbeat and the queue's
samples, read from the pump's counters; a clean stop writes the last and says stopped), and
the waiter of other processes' sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from sqlqueue_orm import exceptions, sqlalchemy_internals
from sqlqueue_orm.aio.context import AsyncHandlerContext, bridged
from sqlqueue_orm.aio.transport import AsyncTransport, connecting
from sqlqueue_orm.receiving import control, health, mover, tasks, waiting, wakeup
from sqlqueue_orm.receiving.circuit_breaker import DATABASE_ERRORS
from sqlqueue_orm.receiving.endpoint import Endpoint
from sqlqueue_orm.receiving.pump import MessagePump
from sqlqueue_orm.receiving.stats import PumpStats

if TYPE_CHECKING:

    import pydantic

    from sqlqueue_orm.receiving.settings import EndpointSettings

__all__ = ["AsyncEndpoint", "AsyncHandlerContext"]

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound="pydantic.BaseModel")

#: Longest wait (seconds) of the delayed-message mover between two runs.
_MOVE_EVERY = 1.0


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


class _Controlled:
    """The pump as the control poller drives it from its thread; each change wakes the loop."""

    def __init__(self, pump: MessagePump, changed: Callable[[], object]) -> None:
        self.pump = pump
        self.changed = changed

    @property
    def concurrency(self) -> int:
        """Async handlers run at once at most, now."""
        return self.pump.concurrency

    def resize(self, concurrency: int) -> None:
        """Run at most *concurrency* handlers at once; those begun before a shrink finish."""
        self.pump.resize(concurrency)  # not started: only its concurrency, which the loop reads
        self.changed()

    def set_paused(self, paused: bool) -> None:
        """Start no receive (the handlers in flight finish), or receive again at once."""
        self.pump.set_paused(paused)
        self.changed()


class AsyncEndpoint:
    """An input queue and its async handlers, run on the event loop that awaits :meth:`run`.

    :param name: the endpoint's name, which is its input queue.
    :param transport: an :class:`AsyncTransport`, a URL or an ``AsyncEngine``.
    :param settings: :class:`EndpointSettings`; keyword arguments override single settings.
    :param on_critical_error: as the :class:`Endpoint`'s.

    The handlers' session is the endpoint's database (no ``user_database``). The health beats,
    the operator's control and the wake-up by other processes' sends run as the
    :class:`Endpoint`'s. Not here (see ``docs/asyncio.md``, Limits): the instance-specific
    queue and the watchdog.
    """

    def __init__(
        self,
        name: str,
        transport: AsyncTransport | str | AsyncEngine,
        *,
        settings: EndpointSettings | None = None,
        on_critical_error: Callable[[str, BaseException], object] | None = None,
        **overrides: Any,
    ) -> None:
        if isinstance(transport, AsyncTransport):
            self.transport, self._owns_transport = transport, False
        else:
            self.transport, self._owns_transport = AsyncTransport(transport), True
        #: The synchronous endpoint underneath: its handlers, settings and receive.
        self.endpoint = Endpoint(
            name,
            self.transport.transport,
            settings=settings,
            on_critical_error=on_critical_error,
            **overrides,
        )
        self.name = name
        self._paused_here = False
        self._pump: MessagePump | None = None
        #: Handlers in flight (tasks started and not yet done with their receive).
        self._running = 0
        #: Set when a handler ends or the operator changes the concurrency or the pause.
        self._place: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._control: control.ControlPoller | None = None
        self._health: health.HealthWriter | None = None
        self._waiter: wakeup.IdleWaiter | None = None
        #: The waiter was told the loop is idle (its ``idle`` registered it).
        self._registered = False
        self._stopping = False
        self._in_flight: set[asyncio.Task[None]] = set()
        self._idle: list[tasks.Worker] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._mover_task: asyncio.Task[None] | None = None
        self._waker: Callable[[], None] | None = None
        self._stopped: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"<AsyncEndpoint {self.name} {self.settings.transaction_mode.value}>"

    @property
    def settings(self) -> EndpointSettings:
        """The endpoint's :class:`EndpointSettings` (replace it before :meth:`start`)."""
        return self.endpoint.settings

    @settings.setter
    def settings(self, settings: EndpointSettings) -> None:
        self.endpoint.settings = settings

    # -- handlers --------------------------------------------------------------------------
    def handle(
        self,
        model: type[ModelT],
        handler: Callable[[ModelT, AsyncHandlerContext], Awaitable[object]] | None = None,
        *,
        type_name: str | None = None,
        event: bool = False,
    ) -> Any:
        """Register the ``async def`` *handler* for messages of *model* (:meth:`Endpoint.handle`).

        Usable as a decorator. :raises ConfigurationError: *handler* is not ``async def``.
        """

        def register(
            function: Callable[[ModelT, AsyncHandlerContext], Awaitable[object]],
        ) -> Any:
            self.endpoint.handle(model, bridged(function), type_name=type_name, event=event)
            return function

        if handler is not None:
            return register(handler)
        return register

    def handle_raw(
        self, handler: Callable[[bytes, AsyncHandlerContext], Awaitable[object]]
    ) -> Callable[[bytes, AsyncHandlerContext], Awaitable[object]]:
        """Register the ``async def`` *handler* for every message (body bytes and context)."""
        self.endpoint.handle_raw(bridged(handler))
        return handler

    def map_type(self, model: type[Any], type_name: str) -> None:
        """Send and publish *model* as the .NET type *type_name* (:meth:`Endpoint.map_type`)."""
        self.endpoint.map_type(model, type_name)

    # -- running ---------------------------------------------------------------------------
    @property
    def stats(self) -> PumpStats:
        """Counters of the running (or last) run: received, handled, failed, in flight, ..."""
        return self._pump.stats if self._pump is not None else PumpStats()

    @property
    def paused(self) -> bool:
        """No receive starts (handlers in flight finish): :meth:`pause`, or the operator's."""
        return self._paused_here or (self._pump is not None and self._pump.paused)

    @property
    def concurrency(self) -> int:
        """Handlers run at once at most, now: the setting, or the operator's override."""
        return self.settings.concurrency if self._pump is None else self._pump.concurrency

    def pause(self) -> None:
        """Start no receive until :meth:`resume`; the handlers in flight finish."""
        self._paused_here = True

    def resume(self) -> None:
        """Receive again after :meth:`pause` (not after the operator's pause)."""
        self._paused_here = False
        self._changed()

    def _changed(self) -> None:
        """The pause or the concurrency changed: the loop looks again."""
        for event in (self._wake, self._place):
            if event is not None:
                event.set()

    async def start(self, *, once: bool = False) -> None:
        """Check the settings, create the queues if asked, and start receiving in tasks.

        *once*: the loop ends when the queue is drained (see :meth:`run`).

        :raises ConfigurationError: a mode the database cannot honour, or a setting the
            asyncio endpoint does not run (an ``instance_name``).
        """
        endpoint = self.endpoint
        settings = endpoint.settings
        if self._loop_task is not None and not self._loop_task.done():
            raise exceptions.SqlQueueError(f"endpoint {self.name!r} is already running")
        if settings.instance_name is not None:
            raise exceptions.ConfigurationError(
                f"endpoint {self.name!r}: instance_name is not supported by AsyncEndpoint; "
                "run an Endpoint for an instance-specific queue"
            )
        with connecting():  # in the bridge: the first connection tells the default schema
            [pump] = await sqlalchemy_internals.greenlet_spawn(endpoint.prepare_pumps)
        self._pump, self._running = pump, 0
        self._wake, self._place, self._stopped = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._stopping = False
        loop = asyncio.get_running_loop()
        await self._start_operations(loop)
        wake = self._wake

        def waker() -> None:  # a send of this process committed, on any thread
            loop.call_soon_threadsafe(wake.set)

        self._waker = waker
        table = self.transport.transport.queues.address(self.name).table
        wakeup.local_wakeups(self.transport.transport).register(table, waker)
        self._loop_task = asyncio.create_task(self._loop(once), name=f"{self.name} pump")
        if settings.delayed_delivery:
            self._mover_task = asyncio.create_task(
                self._move(mover.DelayedMessageMover(self._pump.handling)),
                name=f"{self.name} mover",
            )
        log.info(
            "queue %s: async endpoint started (%s, concurrency %d)",
            self.name,
            settings.transaction_mode.value,
            self._pump.concurrency,
        )

    async def _start_operations(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the control poller, the health writer and the waiter of other processes' sends.

        The poller reads the control row once before the loop starts; the waiter is the one
        :mod:`~sqlqueue_orm.receiving.waiting` chooses for the database, as an Endpoint's.
        """
        pump, settings, wake = self._pump, self.settings, self._wake
        assert pump is not None and wake is not None
        try:
            threads = self.transport.for_threads()
        except exceptions.ConfigurationError as error:  # no synchronous driver installed
            log.warning(
                "queue %s: no live control and no health beats: %s", self.name, error
            )
            return
        poller = control.ControlPoller(
            self.name,
            threads.engine,
            _Controlled(pump, lambda: loop.call_soon_threadsafe(self._changed)),
            [],
        )
        # the operator's pause and concurrency, read before the loop starts
        await asyncio.to_thread(poller.prepare, settings.create_queues)
        poller.start()
        self._control = poller
        if settings.heartbeat_interval is not None:
            self._health = health.HealthWriter(self.name, threads, [pump], settings, poller.ops)
            self._health.start()

        def woken() -> None:  # on the waiter's thread
            loop.call_soon_threadsafe(wake.set)

        def listen() -> wakeup.IdleWaiter | None:
            address = threads.queues.address(self.name)
            waiter = waiting.prepare(threads.engine, address, settings)
            if waiter is not None:
                waiter.start(woken, woken)
            return waiter

        self._waiter, self._registered = await asyncio.to_thread(listen), False

    async def _stop_operations(self) -> None:
        """After the handlers: the poller, the last sample and the stopped beat, the connection.

        After the handlers, whose receives (SQLite's write lock) a beat may be waiting for; a
        resume read meanwhile starts nothing, the loop is stopping. Each a synchronous call:
        on a thread, never on the event loop.
        """
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            await asyncio.to_thread(waiter.stop)
        poller, self._control = self._control, None
        if poller is not None:
            await asyncio.to_thread(poller.stop)
        beating, self._health = self._health, None
        if beating is not None:
            await asyncio.to_thread(beating.stop)
        if poller is not None:
            await asyncio.to_thread(poller.ops.close)

    async def run(self, *, once: bool = False) -> None:
        """Start, then run until SIGTERM, SIGINT or :meth:`stop` (*once*: until drained).

        Drained: a receive found nothing with no handler in flight. A second signal while
        stopping cancels the handlers in flight (their messages return to the queue). Signal
        handlers are installed only in the main thread, and removed on return.
        """
        await self.start(once=once)
        assert self._loop_task is not None and self._stopped is not None
        with self._signals():
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            if once:
                await self.stop()
            await self._stopped.wait()

    async def stop(self, timeout: float | None = None) -> bool:
        """Start no receive; wait up to *timeout* s (``shutdown_timeout``) for the handlers.

        Those still running then are cancelled: each receive's transaction rolls back and its
        message returns to the queue. Return whether every handler finished in time.
        """
        if self._stopped is None or self._stopped.is_set() or self._stopping:
            if self._stopped is not None and not self._stopped.is_set():
                await self._stopped.wait()
            return True
        self._stopping = True
        pump = self._pump
        assert pump is not None and self._wake is not None
        pump.stop_taking()  # the circuit breakers' back-off ends
        if self._waker is not None:
            table = self.transport.transport.queues.address(self.name).table
            wakeup.local_wakeups(self.transport.transport).unregister(table, self._waker)
        self._wake.set()
        for background in (self._loop_task, self._mover_task):
            if background is not None and not background.done():
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        limit = self.settings.shutdown_timeout if timeout is None else timeout
        finished = await self._finish(limit)
        for worker in self._idle:
            await sqlalchemy_internals.greenlet_spawn(worker.release)
        self._idle.clear()
        await self._stop_operations()
        self._stopped.set()
        log.info("queue %s: async endpoint stopped (%d handled)", self.name, pump.stats.handled)
        return finished

    async def _finish(self, limit: float) -> bool:
        """Wait up to *limit* s for the tasks in flight; cancel (roll back) the rest."""
        running = set(self._in_flight)
        if not running:
            return True
        _, late = await asyncio.wait(running, timeout=limit)
        if late:
            log.warning(
                "queue %s: %d handler(s) still running after %.1f s; cancelling them "
                "(their receives roll back, their messages return to the queue)",
                self.name,
                len(late),
                limit,
            )
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        return not late

    async def close(self) -> None:
        """Stop (if running) and close the transport if this endpoint made it."""
        await self.stop()
        if self._owns_transport:
            await self.transport.close()

    async def __aenter__(self) -> AsyncEndpoint:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the loop ----------------------------------------------------------------------------
    async def _loop(self, once: bool) -> None:
        pump, place = self._pump, self._place
        assert pump is not None and place is not None
        while not self._stopping:
            if self.paused:
                await self._sleep(self.settings.peek_delay)
                continue
            if self._running >= pump.concurrency:  # read now: a live resize changes it
                place.clear()
                await place.wait()  # a handler ends, or the operator changes something
                continue
            self._running += 1  # a free place: never more than concurrency in flight
            worker = self._idle.pop() if self._idle else pump.worker()
            received = _Received()
            receipt = pump.receipt(received, worker)
            beside = bool(self._in_flight)  # a handler then may return its message after
            task = asyncio.create_task(self._one(receipt, worker))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            await received.event.wait()
            if received.found:
                await self._busy()
                continue  # more may wait: receive again at once
            for idle in self._idle:  # nothing waiting: no connection kept idle
                await sqlalchemy_internals.greenlet_spawn(idle.release)
            self._idle.clear()
            if once:
                await asyncio.wait({task})  # its empty receive ends
                others = set(self._in_flight)
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
        delay = self.settings.peek_delay
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
        """Wait up to *timeout* s, or until a send of this process (or a stop) wakes the loop."""
        wake = self._wake
        assert wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)
        wake.clear()

    def _process(self, receipt: tasks.Receipt, worker: tasks.Worker) -> None:
        """The synchronous endpoint's receive of one message (run in the bridge)."""
        pump = self._pump
        assert pump is not None
        try:
            pump.mode.process(receipt, worker)
        finally:
            if not receipt.found:
                worker.release()

    async def _one(self, receipt: tasks.Receipt, worker: tasks.Worker) -> None:
        """One message in flight: its receive, its handlers, its commit (or its rollback)."""
        pump, place = self._pump, self._place
        assert pump is not None and place is not None
        failure: BaseException | None = None
        try:
            await sqlalchemy_internals.greenlet_spawn(self._process, receipt, worker)
        except DATABASE_ERRORS as error:
            failure = error
        except Exception:  # a bug: said loudly; the next message is received as usual
            log.error("queue %s: processing failed", self.name, exc_info=True)
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
            place.set()
        if failure is not None:
            pump.rewind()
            # the breaker's back-off sleeps: on a thread, this task keeping its place
            await asyncio.to_thread(pump.receive_breaker.failure, failure)
        else:
            pump.receive_breaker.success()

    async def _move(self, moving: mover.DelayedMessageMover) -> None:
        """Move matured delayed messages (delayed retries, deferred sends) to the queue."""
        wake = self._wake
        assert wake is not None
        while True:
            try:
                with connecting():
                    moved, due = await sqlalchemy_internals.greenlet_spawn(moving.move_once)
            except DATABASE_ERRORS as error:
                log.warning("queue %s: moving delayed messages failed: %s", self.name, error)
                moved, due = 0, None
            if moved:
                wake.set()
            if moved >= moving.batch_size:
                continue
            await asyncio.sleep(_MOVE_EVERY if due is None else min(_MOVE_EVERY, due))

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Task[bool]] = []

        def on_signal() -> None:
            if not stopping:
                log.info("queue %s: stopping on a signal", self.name)
                stopping.append(loop.create_task(self.stop()))
            else:  # a second signal: the handlers in flight roll back now
                for task in set(self._in_flight):
                    task.cancel()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)
        try:
            yield
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
