"""Endpoint: an input queue, the handlers of its messages, and the pump that feeds them.

::

    endpoint = Endpoint("sales", "sqlite:///app.db")

    @endpoint.handle(PlaceOrder, type_name="Sales.Messages.PlaceOrder")
    def place(order: PlaceOrder, context: HandlerContext) -> None:
        context.session.add(Order(id=order.id))
        context.reply(OrderPlaced(id=order.id))

    endpoint.run()            # until SIGTERM / SIGINT / endpoint.stop()

Handlers are registered per pydantic model and matched through the
``NServiceBus.EnclosedMessageTypes`` header: its first entry whose full type name (the part
before the first comma of a .NET assembly-qualified name) is registered wins. A model is
registered under ``module.QualName`` unless ``type_name=`` names the .NET type it stands for, so
a Python endpoint handles what a .NET endpoint sent, and its own sends of that model carry the
.NET name. Several handlers of one type run in registration order, in the same transaction;
raw handlers (``handle_raw``) then run for every message. A message nothing accepts is a
processing failure (:class:`~sqlqueue_orm.exceptions.UnknownMessageType`). The registry and the
:class:`HandlerContext` handlers get are in :mod:`sqlqueue_orm.receiving.handling`.

Handlers are synchronous and run on the pump's worker threads. ``async def`` handlers run in
an :class:`~sqlqueue_orm.aio.AsyncEndpoint`: tasks of one event loop, each running this
endpoint's receive (its transaction modes, its recoverability) through SQLAlchemy's asyncio
bridge.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, dialects, exceptions, headers
from sqlqueue_orm.pubsub import publishing
from sqlqueue_orm.receiving import (
    control,
    failure_entries,
    flow,
    forwarding,
    health,
    modes,
    mover,
    pump,
    unanswered,
    waiting,
    wakeup,
)
from sqlqueue_orm.receiving.handling import (
    RELATED_TO,
    HandlerContext,
    Handling,
    ModelT,
    Outgoing,
    RawHandler,
    full_type_name,
)
from sqlqueue_orm.receiving.settings import EndpointSettings
from sqlqueue_orm.receiving.stats import PumpStats
from sqlqueue_orm.transport import Closing, Transport

if TYPE_CHECKING:
    from sqlqueue_orm.instrumentation import Instrumentation
    from sqlqueue_orm.sending.outbox import Outbox

__all__ = ["RELATED_TO", "Endpoint", "HandlerContext"]

log = logging.getLogger(__name__)

#: Longest exception message copied into the error queue's headers (as NServiceBus truncates).
MAX_EXCEPTION_MESSAGE = forwarding.MAX_EXCEPTION_MESSAGE

#: Seconds :meth:`Endpoint.run` waits at a time: a signal another thread took runs its Python
#: handler only once the main thread runs again, which an untimed wait never lets it do.
_SIGNAL_CHECK = 0.2


class Endpoint(Closing):
    """An input queue, handlers per message type, and a pump running them in a transaction mode.

    :param name: the endpoint's name, which is its input queue.
    :param transport: the :class:`Transport` of the queues (or a URL, or an Engine).
    :param settings: :class:`EndpointSettings`; keyword arguments override single settings
        (``Endpoint("sales", url, concurrency=4)``).
    :param user_database: the engine (or transport) of the database the handlers' ORM session
        writes to; default the endpoint's own. TRANSACTION_SCOPE refuses another database
        (use the outbox mode).
    :param outbox: the outbox of mode OUTBOX (default: an outbox in the user database).
    :param on_critical_error: called with a description and the last error when peeking or
        receiving has failed for ``critical_error_after`` seconds in a row.
    :param instrumentation: traces and metrics of the handlers' runs and of what became of each
        message (:mod:`sqlqueue_orm.instrumentation`); default: the transport's.
    """

    def __init__(
        self,
        name: str,
        transport: Transport | str | Engine,
        *,
        settings: EndpointSettings | None = None,
        user_database: Engine | Transport | None = None,
        outbox: Outbox | None = None,
        on_critical_error: Callable[[str, BaseException], object] | None = None,
        instrumentation: Instrumentation | None = None,
        **overrides: Any,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise exceptions.ConfigurationError(f"endpoint name {name!r} must name a queue")
        self.name = name
        if isinstance(transport, Transport):
            self.transport = transport
            self._owns_transport = False
        else:
            self.transport = Transport(transport)
            self._owns_transport = True
        settings = settings or EndpointSettings()
        self.settings = settings.replace(**overrides) if overrides else settings
        if isinstance(user_database, Transport):
            self.user_transport = user_database
        elif isinstance(user_database, Engine) and user_database is not self.transport.engine:
            self.user_transport = Transport(user_database)
        else:
            self.user_transport = self.transport
        self.outbox = outbox
        self.on_critical_error = on_critical_error
        #: The handlers and what the receives and sends need of this endpoint.
        self._handling = handling = Handling(
            name,
            self.transport,
            self.settings,
            self.user_transport,
            outbox,
            on_critical_error,
            instrumentation,
        )
        self.machine = handling.machine
        self._pump: pump.MessagePump | None = None
        self._mover: mover.DelayedMessageMover | None = None
        self._instance_pump: pump.MessagePump | None = None
        self._control: control.ControlPoller | None = None
        self._health: health.HealthWriter | None = None
        self._watchdog: unanswered.Watchdog | None = None
        #: Held through :meth:`start`, and taken by :meth:`stop`: a stop that begins during
        #: start-up (a signal's) waits for it, then stops every part it started.
        self._lock = threading.Lock()
        #: Held through :meth:`stop`: a second stop waits for the first, then finds it done.
        self._stop_lock = threading.Lock()
        #: The stop a signal started, on a thread of its own.
        self._stopper: threading.Thread | None = None
        self._hurried = False

    @property
    def address_text(self) -> str:
        """The input queue's address as the .NET transport writes it (``ReplyToAddress``)."""
        return self._handling.address_text

    def __repr__(self) -> str:
        return f"<Endpoint {self.name} {self.settings.transaction_mode.value}>"

    # -- handlers --------------------------------------------------------------------------
    def handle(
        self,
        model: type[ModelT],
        handler: Callable[[ModelT, HandlerContext], object] | None = None,
        *,
        type_name: str | None = None,
        event: bool = False,
    ) -> Any:
        """Register *handler* for messages of *model* (a pydantic model class).

        Usable as a decorator (``@endpoint.handle(PlaceOrder)``). *type_name*: the full .NET
        type name the messages carry (``Sales.Messages.PlaceOrder``); default
        ``module.QualName``, what this library's sends write (a model registered under a .NET
        name is matched under its Python name too). *event*: *model* is an event this endpoint
        subscribes to at start-up (setting ``auto_subscribe``).
        """
        if not hasattr(model, "model_validate_json"):
            raise exceptions.ConfigurationError(
                f"{model!r} is not a pydantic model class; use handle_raw for bytes"
            )
        default = f"{model.__module__}.{model.__qualname__}"
        name = full_type_name(type_name) if type_name else default
        if not name:
            raise exceptions.ConfigurationError(f"type_name {type_name!r} is empty")

        def register(function: Callable[[ModelT, HandlerContext], object]) -> Any:
            self._handling.register(model, name, default, function, event)
            return function

        if handler is not None:
            return register(handler)
        return register

    def send(
        self,
        destination: str | addressing.QueueAddress,
        message: Outgoing,
        connection: Connection | None = None,
        *,
        delay: dt.timedelta | float | None = None,
        deliver_at: dt.datetime | None = None,
        reply_to_this_instance: bool = False,
    ) -> str:
        """Send *message* from this endpoint, outside any handler (a new conversation).

        It carries ``ReplyToAddress`` (this endpoint's queue, so replies come here; with
        *reply_to_this_instance*, this instance's own queue), ``OriginatingEndpoint``,
        ``OriginatingMachine``, a new ``ConversationId`` and ``MessageIntent: Send``, unless it
        sets them. With *connection*, it is sent in that connection's transaction. With *delay*
        (seconds or a timedelta) or *deliver_at*, it waits in this endpoint's delayed table
        until due (see ``docs/recoverability.md``); this endpoint's mover then forwards it, so
        the endpoint must be running (or another instance of it). Return its message id.

        :raises ConfigurationError: *reply_to_this_instance* without an ``instance_name``.
        """
        outgoing = self._handling.outgoing(message)
        if reply_to_this_instance:
            outgoing = self._handling.reply_to_instance(outgoing)
        stamped = dict(outgoing.headers)
        stamped.setdefault(headers.MESSAGE_INTENT, "Send")
        stamped.setdefault(headers.CONVERSATION_ID, str(uuid.uuid4()))
        stamped.setdefault(headers.ORIGINATING_ENDPOINT, self.name)
        stamped.setdefault(headers.ORIGINATING_MACHINE, self.machine)
        stamped.setdefault(headers.REPLY_TO_ADDRESS, self.address_text)
        stamped_message = dataclasses.replace(outgoing, headers=stamped)
        if delay is not None or deliver_at is not None:
            return self.transport.send(
                destination,
                stamped_message,
                connection=connection,
                delay=delay,
                deliver_at=deliver_at,
                endpoint=self.name,
            )
        return self.transport.send(destination, stamped_message, connection=connection)

    @property
    def instance_address(self) -> addressing.QueueAddress | None:
        """The instance-specific queue, ``<endpoint>.<instance_name>`` (None without a name).

        In the input queue's schema and catalog, named as NServiceBus names it (the table
        names of the base address and the discriminator joined by ``.``:
        ``QueueAddressTranslator.cs`` of NServiceBus.SqlServer).
        """
        return self._handling.instance_address

    def handle_raw(self, handler: RawHandler) -> RawHandler:
        """Register *handler* for every message: it gets the body bytes and the context."""
        self._handling.register_raw(handler)
        return handler

    def map_type(self, model: type[Any], type_name: str) -> None:
        """Send and publish *model* as the .NET type *type_name*, without handling it.

        A publisher maps its events (and their base types) so .NET subscribers, which
        subscribe to ``Namespace.TypeName``, receive them.
        """
        name = full_type_name(type_name) if isinstance(type_name, str) else ""
        if not name:
            raise exceptions.ConfigurationError(f"type_name {type_name!r} is empty")
        self._handling.map_type(model, name)

    def subscribe(self, event_type: type[Any] | str, connection: Connection | None = None) -> None:
        """Subscribe this endpoint's queue to *event_type* (a model class, or a topic name)."""
        self.transport.subscriptions.subscribe(
            self.name, self._handling.topic(event_type), self.address_text, connection
        )

    def unsubscribe(
        self, event_type: type[Any] | str, connection: Connection | None = None
    ) -> None:
        """Remove this endpoint's subscription to *event_type*."""
        self.transport.subscriptions.unsubscribe(
            self.name, self._handling.topic(event_type), connection
        )

    def publish(self, event: Outgoing, connection: Connection | None = None) -> str:
        """Publish *event* from this endpoint, outside any handler (see :meth:`Transport.publish`).

        Carries the headers :meth:`send` sets, with ``MessageIntent: Publish``; the topics are
        the .NET names registered for the event's type and its base types. Return its id.
        """
        outgoing = self._handling.event_message(event)
        stamped = dict(outgoing.headers)
        stamped.setdefault(headers.MESSAGE_INTENT, publishing.PUBLISH)
        stamped.setdefault(headers.CONVERSATION_ID, str(uuid.uuid4()))
        stamped.setdefault(headers.ORIGINATING_ENDPOINT, self.name)
        stamped.setdefault(headers.ORIGINATING_MACHINE, self.machine)
        stamped.setdefault(headers.REPLY_TO_ADDRESS, self.address_text)
        return self.transport.publish(
            dataclasses.replace(outgoing, headers=stamped),
            connection,
            type_names=self._handling.type_names,
        )

    # -- running ---------------------------------------------------------------------------
    @property
    def stats(self) -> PumpStats:
        """Counters of the running (or last) pump of the input queue: received, handled, ..."""
        return self._pump.stats if self._pump is not None else PumpStats()

    @property
    def instance_stats(self) -> PumpStats:
        """The same counters for the instance-specific queue (zero without one)."""
        current = self._instance_pump
        return current.stats if current is not None else PumpStats()

    def _pumps(self) -> list[pump.MessagePump]:
        return [each for each in (self._pump, self._instance_pump) if each is not None]

    def _mode_for(self, queue: str | addressing.QueueAddress | None) -> modes.ReceiveMode:
        """The mode receiving from *queue* (None: the input queue) through its chosen receiver."""
        receiver = flow.receiver_for(
            self.transport, self.name if queue is None else queue, self.settings
        )
        return modes.for_endpoint(self._handling, receiver, queue)

    def _create_queues(self, queues: list[str | addressing.QueueAddress]) -> None:
        """Create the input *queues*, the error queue, and the delayed table and audit queue."""
        for queue in queues:
            self.transport.create_queue(queue)
        self.transport.create_queue(self.settings.error_queue)
        if self.settings.delayed_delivery:
            self.transport.create_delayed_table(self.name)
        if self.settings.audit_queue is not None:
            self.transport.create_queue(self.settings.audit_queue)

    def start(self) -> None:
        """Check the configuration, create the queues if asked, and start the pump threads.

        :raises ConfigurationError: a mode the databases cannot honour (see docs/endpoint.md).
        """
        with self._lock:
            if self._pump is not None and self._pump.running:
                raise exceptions.SqlQueueError(f"endpoint {self.name!r} is already running")
            if self.settings.unanswered_after is not None and self._watchdog is None:
                # first: every connection the endpoint checks out from here on is watched
                self._watchdog = unanswered.Watchdog(
                    self.transport.engine, self.settings.unanswered_after
                )
                self._watchdog.start()
            instance = self.instance_address
            pumps = self.prepare_pumps()
            waiters: list[wakeup.IdleWaiter | None] = [
                waiting.prepare(
                    self.transport.engine, self.transport.queues.address(each.queue), self.settings
                )
                for each in pumps
            ]
            self._pump, self._instance_pump = pumps[0], (pumps[1] if len(pumps) > 1 else None)
            # the operator's pause and concurrency, read before the pumps start
            self._control = control.ControlPoller(
                self.name, self.transport.engine, self._pump, self._pumps()[1:]
            )
            self._control.prepare(create=self.settings.create_queues)
            for each, waiter in zip(self._pumps(), waiters, strict=True):
                each.start(waiter)
            self._control.start()
            if self.settings.delayed_delivery:
                self._mover = mover.DelayedMessageMover(self._handling)
                self._mover.start()
            if self.settings.heartbeat_interval is not None:
                self._health = health.HealthWriter(
                    self.name, self.transport, self._pumps(), self.settings, self._control.ops
                )
                self._health.start()
        log.info(
            "queue %s: endpoint started (%s, concurrency %d)",
            self.name,
            self.settings.transaction_mode.value,
            self.settings.concurrency,
        )
        if instance is not None:
            log.info(
                "queue %s: instance-specific queue %s started (concurrency %d)",
                self.name,
                instance,
                self.settings.instance_concurrency,
            )

    def prepare_pumps(self) -> list[pump.MessagePump]:
        """What a start does before receiving; return the pumps to run, not started.

        The settings replaced since construction apply (``sqlqueue run --concurrency``); the
        queues, tables, subscriptions and purge of :meth:`_install` are done; the pumps are the
        input queue's, then the instance-specific queue's when the settings name an instance.
        The :class:`~sqlqueue_orm.aio.AsyncEndpoint` starts through it too (in SQLAlchemy's
        asyncio bridge), so both run one receive, one installer and one set of modes.

        :raises ConfigurationError: a mode the databases cannot honour, or a database only one
            connection reaches (in-memory SQLite).
        """
        engine = self.transport.engine
        dialects.for_dialect(engine).require_shared(engine.url)  # its threads' connections
        self._handling.settings = self.settings
        mode = self._mode_for(None)
        instance = self.instance_address
        queues: list[str | addressing.QueueAddress] = [self.name]
        if instance is not None:
            queues.append(instance)
        self._install(mode, queues)
        pumps = [pump.MessagePump(self._handling, mode)]
        if instance is not None:
            pumps.append(
                pump.MessagePump(
                    self._handling,
                    self._mode_for(instance),
                    concurrency=self.settings.instance_concurrency,
                )
            )
        return pumps

    def _install(
        self, mode: modes.ReceiveMode, queues: list[str | addressing.QueueAddress]
    ) -> None:
        """Queues and tables, what *mode* needs, subscriptions and a purge, before receiving.

        The queues (*queues*, the error, audit and delayed ones) and the subscription table
        when the settings create them, what *mode* needs, the auto-subscriptions, and the
        purge of expired messages when asked.
        """
        settings = self.settings
        if settings.create_queues:
            self._create_queues(queues)
        mode.prepare()
        failure_entries.prepare(
            self.transport, settings.error_queue, create=settings.create_queues
        )
        if settings.create_queues:
            self.transport.create_subscription_table()
        if settings.auto_subscribe:
            for event_type in self._handling.events:
                self.subscribe(event_type)
        if settings.purge_expired_at_startup:
            for queue in queues:
                self.transport.purge_expired(queue)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop taking messages and let in-flight handlers finish within *timeout* seconds.

        Default: ``settings.shutdown_timeout``. What is still running then is rolled back (its
        connection is closed under it), so its message returns to the queue. Return whether
        everything finished in time. A stop called while another runs waits for it; one called
        while a start runs (a signal during start-up) waits for the start to end.
        """
        with self._stop_lock, self._lock:
            return self._stop(timeout)

    def _stop(self, timeout: float | None) -> bool:
        pumps = self._pumps()
        limit = self.settings.shutdown_timeout if timeout is None else timeout
        if self._control is not None:
            self._control.stop()
        for each in pumps:
            each.stop_taking()  # both queues stop taking before either waits
        moving, self._mover = self._mover, None
        if moving is not None:
            moving.stop_moving()  # its join waits below: it may wait for SQLite's write lock
        deadline = time.monotonic() + limit
        finished = True
        for each in pumps:
            finished = each.stop(max(0.0, deadline - time.monotonic())) and finished
        if moving is not None:
            moving.stop()
        beating, self._health = self._health, None
        if beating is not None:
            beating.stop()  # after the pumps: the last beat says stopped, with final counts
        if self._control is not None:
            self._control.ops.close()  # the connection its poller and health writer shared
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop()
        return finished

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the pumps have stopped; return whether they have."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for each in self._pumps():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not each.wait(left):
                return False
        return True

    def run(self, *, once: bool = False) -> None:
        """Start, then block until SIGTERM, SIGINT or :meth:`stop` (*once*: until drained).

        Drained: a peek and then a receive found nothing with no handler in flight, on the
        input queue and on the instance-specific queue.

        A signal's stop has written the last sample and beat when this returns. A second
        signal while stopping ends the wait for the handlers in flight: they are rolled back
        at once (their messages return to the queue), as at ``shutdown_timeout``.

        Signal handlers are installed only when called from the main thread; the previous
        ones are restored on return.
        """
        self._stopper, self._hurried = None, False
        with self._signals():
            self.start()
            assert self._pump is not None
            if once:
                for each in self._pumps():  # the input queue and the instance-specific one
                    while not each.drained.wait(0.1) and each.running:
                        pass  # a signal's stop ends the wait too
                self.stop()
            while not self.wait(_SIGNAL_CHECK):
                pass
            # The stop goes on after the pumps (the mover, the last sample, the beat saying
            # stopped), a signal's on a thread the interpreter does not wait for: the process
            # ends when this returns, so the stop must have ended first.
            while not self._stop_lock.acquire(timeout=_SIGNAL_CHECK):
                pass
            self._stop_lock.release()

    @contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if self._stopper is None:
                log.info(
                    "queue %s: %s received; stopping (a second signal rolls back the handlers "
                    "still running)",
                    self.name,
                    name,
                )
                # not in the handler: it interrupts the main thread wherever it is
                self._stopper = threading.Thread(
                    target=self.stop, name=f"stop {self.name}", daemon=True
                )
                self._stopper.start()
            elif not self._hurried:
                # the stop in progress ends its wait for the handlers now: those still
                # running roll back and their messages return to the queue, as at the
                # shutdown timeout; the last sample and beat are still written
                self._hurried = True
                log.info(
                    "queue %s: %s received again; rolling back the handlers still running",
                    self.name,
                    name,
                )
                for each in self._pumps():
                    each.hurry()

        previous = {
            signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def close(self) -> None:
        """Stop (if running) and give back the transport's connections if it made them."""
        self.stop()
        if self._owns_transport:
            self.transport.close()
