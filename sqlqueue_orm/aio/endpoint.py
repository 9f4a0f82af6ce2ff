"""AsyncEndpoint: an endpoint whose handlers are coroutines, on one event loop.

::

    endpoint = AsyncEndpoint("sales", "postgresql+asyncpg://app@db/shop", concurrency=8)

    @endpoint.handle(PlaceOrder)
    async def place(order: PlaceOrder, context: AsyncHandlerContext) -> None:
        context.session.add(Order(id=order.id))      # an AsyncSession, in the receive's tx
        await context.reply(OrderPlaced(id=order.id))

    await endpoint.run()      # until SIGTERM / SIGINT / await endpoint.stop()

One core: each queue the endpoint receives from (its input queue, and its instance-specific
queue with an ``instance_name``) is a :class:`~sqlqueue_orm.aio.pumping.QueueLoop` on the
event loop, driving the pump the synchronous endpoint prepared for it
(:meth:`Endpoint.prepare_pumps <sqlqueue_orm.receiving.endpoint.Endpoint.prepare_pumps>`):
each message in flight is one task running the synchronous endpoint's own receive (the
transaction mode, the retries, the error queue, the audit copy, the counts) on the asyncio
engine's connections through SQLAlchemy's greenlet bridge; where the mode runs the handlers,
the handler coroutine is awaited on the event loop, with an ``AsyncSession`` over the session
the mode gives (in TRANSACTION_SCOPE: inside the receive's transaction). Never more handlers
run than the concurrency in force; a stop waits up to ``shutdown_timeout`` for them, then
cancels the rest, whose receives roll back.

For the operator, the synchronous endpoint's own threads run beside the loop, each on its own
connection of a synchronous engine of the database (:meth:`AsyncTransport.for_threads`): the
:class:`~sqlqueue_orm.receiving.control.ControlPoller` (``sqlqueue control``'s pause, resume
and concurrency reach the loop through :class:`_Controlled`) and, with ``heartbeat_interval``,
the :class:`~sqlqueue_orm.receiving.health.HealthWriter` (the heartbeat and the queue's
samples, read from the pumps' counters; a clean stop writes the last and says stopped), and
per queue the waiter of other processes' sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from sqlqueue_orm import exceptions, sqlalchemy_internals
from sqlqueue_orm import health as health_tables
from sqlqueue_orm.aio.context import AsyncHandlerContext, bridged
from sqlqueue_orm.aio.pumping import QueueLoop
from sqlqueue_orm.aio.transport import AsyncTransport, connecting
from sqlqueue_orm.receiving import control, health, mover, unanswered, waiting, wakeup
from sqlqueue_orm.receiving.circuit_breaker import DATABASE_ERRORS
from sqlqueue_orm.receiving.endpoint import Endpoint
from sqlqueue_orm.receiving.pump import MessagePump
from sqlqueue_orm.receiving.stats import PumpStats

if TYPE_CHECKING:
    import pydantic

    from sqlqueue_orm import addressing
    from sqlqueue_orm.receiving.settings import EndpointSettings
    from sqlqueue_orm.transport import Transport

__all__ = ["AsyncEndpoint", "AsyncHandlerContext"]

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound="pydantic.BaseModel")

#: Longest wait (seconds) of the delayed-message mover between two runs.
_MOVE_EVERY = 1.0


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
    the operator's control, the wake-up by other processes' sends, the instance-specific queue
    and the watchdog (``unanswered_after``; on psycopg's asyncio driver, not asyncpg's) run as
    the :class:`Endpoint`'s (see ``docs/asyncio.md``, Limits).
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
        #: The input queue's loop, then the instance-specific queue's (with an instance_name).
        self._loops: list[QueueLoop] = []
        self._control: control.ControlPoller | None = None
        self._health: health.HealthWriter | None = None
        self._watchdog: unanswered.Watchdog | None = None
        self._stopping = False
        self._mover_task: asyncio.Task[None] | None = None
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
        return self._loops[0].pump.stats if self._loops else PumpStats()

    @property
    def instance_stats(self) -> PumpStats:
        """The same counters for the instance-specific queue (zero without one)."""
        return self._loops[1].pump.stats if len(self._loops) > 1 else PumpStats()

    @property
    def instance_address(self) -> addressing.QueueAddress | None:
        """The instance-specific queue (:attr:`Endpoint.instance_address`; None without one)."""
        return self.endpoint.instance_address

    @property
    def paused(self) -> bool:
        """No receive starts (handlers in flight finish): :meth:`pause`, or the operator's."""
        return self._paused_here or (bool(self._loops) and self._loops[0].pump.paused)

    @property
    def concurrency(self) -> int:
        """Handlers run at once at most, now: the setting, or the operator's override."""
        return self._loops[0].pump.concurrency if self._loops else self.settings.concurrency

    def pause(self) -> None:
        """Start no receive until :meth:`resume`; the handlers in flight finish."""
        self._paused_here = True

    def resume(self) -> None:
        """Receive again after :meth:`pause` (not after the operator's pause)."""
        self._paused_here = False
        for each in self._loops:
            each.changed()

    def _pause_of(self, pump: MessagePump) -> Callable[[], bool]:
        """Whether *pump*'s loop may start no receive: this process's pause, or the operator's."""
        return lambda: self._paused_here or pump.paused

    async def start(self, *, once: bool = False) -> None:
        """Check the settings, create the queues if asked, and start receiving in tasks.

        *once*: the loops end when their queues are drained (see :meth:`run`).

        :raises ConfigurationError: a mode the database cannot honour.
        """
        endpoint = self.endpoint
        settings = endpoint.settings
        if any(each.task is not None and not each.task.done() for each in self._loops):
            raise exceptions.SqlQueueError(f"endpoint {self.name!r} is already running")
        threads = self._threads()
        if settings.unanswered_after is not None and threads is not None:
            # first: every connection the endpoint checks out from here on is watched
            self._watchdog = unanswered.Watchdog(
                self.transport.engine.sync_engine, settings.unanswered_after, threads.engine
            )
            self._watchdog.start()
        with connecting():  # in the bridge: the first connection tells the default schema
            pumps = await sqlalchemy_internals.greenlet_spawn(endpoint.prepare_pumps)
        core = self.transport.transport
        self._loops = [QueueLoop(pump, core, self._pause_of(pump)) for pump in pumps]
        self._stopped, self._stopping = asyncio.Event(), False
        waiters = await self._start_operations(asyncio.get_running_loop(), threads)
        for each, waiter in zip(self._loops, waiters, strict=True):
            each.start(once, waiter)
        if settings.delayed_delivery:
            self._mover_task = asyncio.create_task(
                self._move(mover.DelayedMessageMover(pumps[0].handling)),
                name=f"{self.name} mover",
            )
        log.info(
            "queue %s: async endpoint started (%s, concurrency %d)",
            self.name,
            settings.transaction_mode.value,
            pumps[0].concurrency,
        )
        if len(pumps) > 1:
            log.info(
                "queue %s: instance-specific queue %s started (concurrency %d)",
                self.name,
                pumps[1].queue,
                pumps[1].concurrency,
            )

    def _threads(self) -> Transport | None:
        """The synchronous transport of the threads (None, said once: no synchronous driver)."""
        try:
            return self.transport.for_threads()
        except exceptions.ConfigurationError as error:
            log.warning(
                "queue %s: no live control, no health beats, no watchdog and no wake-up by "
                "other processes' sends: %s",
                self.name,
                error,
            )
            return None

    async def _start_operations(
        self, loop: asyncio.AbstractEventLoop, threads: Transport | None
    ) -> list[wakeup.IdleWaiter | None]:
        """Start the control poller, the health writer and each queue's waiter of other sends.

        The waiters are returned started, in the order of the loops. The poller reads the
        control row once before the loops start; each waiter is the one
        :mod:`~sqlqueue_orm.receiving.waiting` chooses for the database, as an Endpoint's.
        """
        loops, settings = self._loops, self.settings
        if threads is None:
            return [None for _ in loops]
        controlled = [
            _Controlled(each.pump, functools.partial(loop.call_soon_threadsafe, each.changed))
            for each in loops
        ]
        poller = control.ControlPoller(self.name, threads.engine, controlled[0], controlled[1:])
        # the operator's pause and concurrency, read before the loops start
        await asyncio.to_thread(poller.prepare, settings.create_queues)
        poller.start()
        self._control = poller
        if settings.heartbeat_interval is not None:
            # its tables first, before any receive: on SQLite their CREATE beside a receive
            # taking the write lock held that receive up to the busy timeout
            await asyncio.to_thread(health_tables.create_tables, threads.engine)
            pumps = [each.pump for each in loops]
            self._health = health.HealthWriter(self.name, threads, pumps, settings, poller.ops)
            self._health.start()

        def listen(each: QueueLoop) -> wakeup.IdleWaiter | None:
            address = threads.queues.address(each.queue)
            waiter = waiting.prepare(threads.engine, address, settings)
            if waiter is not None:

                def woken() -> None:  # on the waiter's thread
                    loop.call_soon_threadsafe(each.wake.set)

                waiter.start(woken, woken)
            return waiter

        return [await asyncio.to_thread(listen, each) for each in loops]

    async def _stop_operations(self) -> None:
        """After the handlers: the poller, the last sample and the stopped beat, the connection.

        After the handlers, whose receives (SQLite's write lock) a beat may be waiting for; a
        resume read meanwhile starts nothing, the loop is stopping. Each a synchronous call:
        on a thread, never on the event loop.
        """
        poller, self._control = self._control, None
        if poller is not None:
            await asyncio.to_thread(poller.stop)
        beating, self._health = self._health, None
        if beating is not None:
            await asyncio.to_thread(beating.stop)
        if poller is not None:
            await asyncio.to_thread(poller.ops.close)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            await asyncio.to_thread(watchdog.stop)

    async def run(self, *, once: bool = False) -> None:
        """Start, then run until SIGTERM, SIGINT or :meth:`stop` (*once*: until drained).

        Drained: a receive found nothing with no handler in flight. A second signal while
        stopping cancels the handlers in flight (their messages return to the queue). Signal
        handlers are installed only in the main thread, and removed on return.
        """
        await self.start(once=once)
        assert self._stopped is not None
        with self._signals():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*(each.task for each in self._loops if each.task is not None))
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
        for each in self._loops:  # every queue stops taking before any waits
            await each.stop_taking()
        moving = self._mover_task
        if moving is not None and not moving.done():
            moving.cancel()
        limit = self.settings.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        finished = True
        for each in self._loops:
            left = max(0.0, deadline - time.monotonic())
            finished = await each.finish(left) and finished
        if moving is not None:
            # awaited once the handlers are done: a move waiting for a lock a handler's
            # transaction holds (SQLite's write lock) ends only when that transaction does
            with contextlib.suppress(asyncio.CancelledError):
                await moving
        await self._stop_operations()
        self._stopped.set()
        handled = sum(each.pump.stats.handled for each in self._loops)
        log.info("queue %s: async endpoint stopped (%d handled)", self.name, handled)
        return finished

    async def close(self) -> None:
        """Stop (if running) and close the transport if this endpoint made it."""
        await self.stop()
        if self._owns_transport:
            await self.transport.close()

    async def __aenter__(self) -> AsyncEndpoint:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _move(self, moving: mover.DelayedMessageMover) -> None:
        """Move matured delayed messages (delayed retries, deferred sends) to the queue."""
        wake = self._loops[0].wake  # the input queue's loop
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
                for each in self._loops:
                    for task in set(each.in_flight):
                        task.cancel()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)
        try:
            yield
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
