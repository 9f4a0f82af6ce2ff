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
processing failure (:class:`~sqlqueue_orm.exceptions.UnknownMessageType`).

Handlers are synchronous and run on the pump's worker threads. Async handlers would fit as a
second pump whose workers are tasks of one event loop, using SQLAlchemy's asyncio extension for
the same statements; the strategies and the context would keep their shape.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, dialects, exceptions, headers
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.pubsub import publishing
from sqlqueue_orm.pubsub import topics as topic_names
from sqlqueue_orm.receiving import forwarding, mover, pump, strategies, wakeup
from sqlqueue_orm.receiving.settings import EndpointSettings, TransactionMode
from sqlqueue_orm.transport import Transport

if TYPE_CHECKING:
    import pydantic
    from sqlalchemy.orm import Session

    from sqlqueue_orm.instrumentation import Instrumentation
    from sqlqueue_orm.sending.outbox import Outbox

log = logging.getLogger(__name__)

#: ``NServiceBus.RelatedTo``: the id of the message being handled when this one was sent.
RELATED_TO = "NServiceBus.RelatedTo"
#: Longest exception message copied into the error queue's headers (as NServiceBus truncates).
MAX_EXCEPTION_MESSAGE = forwarding.MAX_EXCEPTION_MESSAGE

ModelT = TypeVar("ModelT", bound="pydantic.BaseModel")
TypedHandler = Callable[[Any, "HandlerContext"], object]
RawHandler = Callable[[bytes, "HandlerContext"], object]
Sender = Callable[[str | addressing.QueueAddress, OutgoingMessage], str]
Outgoing = OutgoingMessage | bytes | str | Any


def full_type_name(entry: str) -> str:
    """The full type name of one ``EnclosedMessageTypes`` entry (no assembly, version, key)."""
    return entry.split(",", 1)[0].strip()


class HandlerContext:
    """What a handler gets besides its message: ids, headers, session, send and reply.

    ``session`` is an ORM :class:`~sqlalchemy.orm.Session` bound as the transaction mode
    dictates (the receive's own transaction in TRANSACTION_SCOPE, the unit of work's in OUTBOX,
    a transaction of its own, committed after the handlers, otherwise). ``send`` and ``reply``
    go out as the mode dictates (see ``docs/endpoint.md``).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        message: IncomingMessage,
        sender: Sender,
        session_factory: Callable[[], Session],
    ) -> None:
        self.endpoint = endpoint
        #: The message being handled, as it was received.
        self.message = message
        self._sender = sender
        self._session_factory = session_factory
        #: The session if a handler used it, else None (for the strategies).
        self.session_used: Session | None = None

    @property
    def message_id(self) -> str:
        """``NServiceBus.MessageId`` of the message being handled."""
        return self.message.message_id

    @property
    def headers(self) -> dict[str, str | None]:
        """The headers of the message being handled."""
        return self.message.headers

    @property
    def session(self) -> Session:
        """The ORM session of this message's handling (made on first use)."""
        session = self.session_used
        if session is None:
            session = self.session_used = self._session_factory()
        return session

    def send(
        self,
        destination: str | addressing.QueueAddress,
        message: Outgoing,
        *,
        reply_to_this_instance: bool = False,
    ) -> str:
        """Send *message* (an OutgoingMessage, a pydantic model, bytes or text) to *destination*.

        The message carries ``ConversationId``, ``RelatedTo``, ``OriginatingEndpoint``,
        ``OriginatingMachine``, ``ReplyToAddress`` and ``MessageIntent: Send`` as NServiceBus
        sets them, unless it sets them itself. Return its message id.

        :param reply_to_this_instance: ``ReplyToAddress`` is this instance's own queue
            (``<endpoint>.<instance_name>``), so the reply comes back to this instance.
        :raises ConfigurationError: *reply_to_this_instance* without an ``instance_name``.
        """
        outgoing = self.endpoint.outgoing(message)
        if reply_to_this_instance:
            outgoing = self.endpoint.reply_to_instance(outgoing)
        return self._sender(destination, self._stamp(outgoing, "Send"))

    def reply(self, message: Outgoing) -> str:
        """Send *message* to the ``NServiceBus.ReplyToAddress`` of the message being handled.

        Sets ``MessageIntent: Reply`` and ``CorrelationId`` (the incoming correlation id, else
        its message id), as :meth:`Transport.reply` does, on the mode's connection.

        :raises ConfigurationError: the incoming message has no ReplyToAddress.
        """
        address_text = self.message.headers.get(headers.REPLY_TO_ADDRESS)
        if not address_text:
            raise exceptions.ConfigurationError(
                f"message {self.message_id!r} from queue {self.message.queue!r} has no "
                f"{headers.REPLY_TO_ADDRESS} header to reply to"
            )
        outgoing = self.endpoint.outgoing(message)
        reply_headers = dict(outgoing.headers)
        reply_headers.setdefault(
            headers.CORRELATION_ID,
            self.message.headers.get(headers.CORRELATION_ID) or self.message_id,
        )
        outgoing = dataclasses.replace(outgoing, headers=reply_headers)
        destination = self.endpoint.transport._address(address_text)
        return self._sender(destination, self._stamp(outgoing, "Reply"))

    def defer(
        self,
        message: Outgoing,
        *,
        delay: dt.timedelta | float | None = None,
        deliver_at: dt.datetime | None = None,
        destination: str | addressing.QueueAddress | None = None,
    ) -> str:
        """Send *message* to *destination* (default: this endpoint) after *delay* or at a time.

        It waits in this endpoint's delayed table (``<endpoint>.Delayed``) with
        ``NServiceBus.SqlServer.ForwardDestination``, stored as the mode sends (in the
        receive's transaction where the mode allows), and is moved when due. Not in mode
        OUTBOX yet (its records hold no delivery time). Return its message id.

        :raises ConfigurationError: neither or both of *delay* and *deliver_at*; a
            time_to_be_received on the message; mode OUTBOX.
        """
        if (delay is None) == (deliver_at is None):
            raise exceptions.ConfigurationError("defer needs exactly one of delay or deliver_at")
        if self.endpoint.mode is TransactionMode.OUTBOX:
            raise exceptions.ConfigurationError(
                f"endpoint {self.endpoint.name!r}: defer is not supported in mode OUTBOX yet; "
                "send it from a handler of another mode or after the unit of work"
            )
        outgoing = self._stamp(self.endpoint.outgoing(message), "Send")
        target = self.endpoint.name if destination is None else destination
        return self._deferring_sender(target, outgoing, delay, deliver_at)

    def _deferring_sender(
        self,
        destination: str | addressing.QueueAddress,
        outgoing: OutgoingMessage,
        delay: dt.timedelta | float | None,
        deliver_at: dt.datetime | None,
    ) -> str:
        connection = getattr(self._sender, "connection", None)
        return self.endpoint.transport.send(
            destination,
            outgoing,
            connection=connection,
            delay=delay,
            deliver_at=deliver_at,
            endpoint=self.endpoint.name,
        )
    def publish(self, event: Outgoing) -> str:
        """Publish *event* to every subscriber of its type and base types, as the mode sends.

        One copy per distinct subscribed queue, each sent as :meth:`send` sends (in the
        receive's transaction, the outbox, or at once, as the mode dictates), with
        ``MessageIntent: Publish`` and the headers :meth:`send` sets. Return its message id.
        """
        endpoint = self.endpoint
        outgoing = self._stamp(endpoint.event_message(event), publishing.PUBLISH)
        outgoing, topics = publishing.prepare(outgoing, endpoint.type_names)
        assert outgoing.message_id is not None
        transport = endpoint.transport
        subscribers = transport._subscriptions.subscribers(topics)
        addresses = (transport._address(text) for text in subscribers)
        for destination in dict.fromkeys(addresses):  # one copy per distinct queue
            self._sender(destination, outgoing)
        return outgoing.message_id

    def _stamp(self, outgoing: OutgoingMessage, intent: str) -> OutgoingMessage:
        stamped = dict(outgoing.headers)
        incoming = self.message.headers
        stamped.setdefault(headers.MESSAGE_INTENT, intent)
        stamped.setdefault(
            headers.CONVERSATION_ID, incoming.get(headers.CONVERSATION_ID) or str(uuid.uuid4())
        )
        stamped.setdefault(RELATED_TO, self.message_id)
        stamped.setdefault(headers.ORIGINATING_ENDPOINT, self.endpoint.name)
        stamped.setdefault(headers.ORIGINATING_MACHINE, self.endpoint.machine)
        stamped.setdefault(headers.REPLY_TO_ADDRESS, self.endpoint.address_text)
        return dataclasses.replace(outgoing, headers=stamped)  # the caller's message unchanged


class MessageScope(Protocol):
    """A sender that also makes the handlers' session (a transactional message's scope)."""

    def __call__(
        self, destination: str | addressing.QueueAddress, outgoing: OutgoingMessage, /
    ) -> str:
        """Send *outgoing* to *destination*; return its message id."""

    def session(self) -> Session:
        """The handlers' ORM session."""


class ScopedContext(HandlerContext):
    """A :class:`HandlerContext` whose sender also makes its session (one object less each).

    The context of a TRANSACTION_SCOPE message: its scope sends in the receive's transaction
    and makes the session inside the message's SAVEPOINT.
    """

    def __init__(self, endpoint: Endpoint, message: IncomingMessage, scope: MessageScope) -> None:
        self.endpoint = endpoint
        self.message = message
        self._sender = scope
        self._scope = scope
        self.session_used = None

    @property
    def session(self) -> Session:
        """The ORM session of this message's handling (made on first use)."""
        session = self.session_used
        if session is None:
            session = self.session_used = self._scope.session()
        return session


class Endpoint:
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
        self._instrumentation = instrumentation
        self.machine = socket.gethostname()
        self.address_text = self.transport.address_text(name)
        self._typed: dict[str, tuple[type[Any], list[TypedHandler]]] = {}
        self._names: dict[type[Any], str] = {}
        self._events: list[type[Any]] = []
        #: Replaced, not changed, on registration: a pump reading it needs no copy.
        self._raw: tuple[RawHandler, ...] = ()
        self._pump: pump.MessagePump | None = None
        self._mover: mover.DelayedMessageMover | None = None
        self._instance_pump: pump.MessagePump | None = None
        self._lock = threading.Lock()

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
            with self._lock:
                # the explicit name, and the Python one too (what sends from Python write)
                names = [name] if name == default else [name, default]
                for each in names:
                    known = self._typed.get(each)
                    if known is not None and known[0] is not model:
                        raise exceptions.ConfigurationError(
                            f"type name {each!r} is already registered for {known[0]!r}"
                        )
                entry = self._typed.get(name) or self._typed.get(default) or (model, [])
                for each in names:
                    self._typed[each] = entry
                entry[1].append(function)
                self._names.setdefault(model, name)
                if event and model not in self._events:
                    self._events.append(model)
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
        outgoing = self.outgoing(message)
        if reply_to_this_instance:
            outgoing = self.reply_to_instance(outgoing)
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
        instance = self.settings.instance_name
        if instance is None:
            return None
        shared = self.transport._address(self.name)
        return addressing.QueueAddress(f"{shared.table}.{instance}", shared.schema, shared.catalog)

    def reply_to_instance(self, outgoing: OutgoingMessage) -> OutgoingMessage:
        """*outgoing* with ``ReplyToAddress`` set to this instance's own queue.

        :raises ConfigurationError: the settings give no ``instance_name``.
        """
        address = self.instance_address
        if address is None:
            raise exceptions.ConfigurationError(
                f"endpoint {self.name!r}: reply_to_this_instance needs an instance-specific "
                "queue; set instance_name in its settings"
            )
        instance_text = self.transport.address_text(address)
        return dataclasses.replace(
            outgoing, headers={**outgoing.headers, headers.REPLY_TO_ADDRESS: instance_text}
        )

    def handle_raw(self, handler: RawHandler) -> RawHandler:
        """Register *handler* for every message: it gets the body bytes and the context."""
        with self._lock:
            self._raw = (*self._raw, handler)
        return handler

    def map_type(self, model: type[Any], type_name: str) -> None:
        """Send and publish *model* as the .NET type *type_name*, without handling it.

        A publisher maps its events (and their base types) so .NET subscribers, which
        subscribe to ``Namespace.TypeName``, receive them.
        """
        name = full_type_name(type_name) if isinstance(type_name, str) else ""
        if not name:
            raise exceptions.ConfigurationError(f"type_name {type_name!r} is empty")
        with self._lock:
            self._names[model] = name

    @property
    def type_names(self) -> dict[type[Any], str]:
        """The .NET type names of models, as registered (a copy)."""
        return dict(self._names)

    def topic(self, event_type: type[Any] | str) -> str:
        """The topic of *event_type*: its registered .NET name, else ``module.QualName``."""
        if isinstance(event_type, str):
            return topic_names.check_topic(event_type)
        return topic_names.topic_of(event_type, self._names)

    def subscribe(self, event_type: type[Any] | str, connection: Connection | None = None) -> None:
        """Subscribe this endpoint's queue to *event_type* (a model class, or a topic name)."""
        self.transport._subscriptions.subscribe(
            self.name, self.topic(event_type), self.address_text, connection
        )

    def unsubscribe(
        self, event_type: type[Any] | str, connection: Connection | None = None
    ) -> None:
        """Remove this endpoint's subscription to *event_type*."""
        self.transport._subscriptions.unsubscribe(self.name, self.topic(event_type), connection)

    def publish(self, event: Outgoing, connection: Connection | None = None) -> str:
        """Publish *event* from this endpoint, outside any handler (see :meth:`Transport.publish`).

        Carries the headers :meth:`send` sets, with ``MessageIntent: Publish``; the topics are
        the .NET names registered for the event's type and its base types. Return its id.
        """
        outgoing = self.event_message(event)
        stamped = dict(outgoing.headers)
        stamped.setdefault(headers.MESSAGE_INTENT, publishing.PUBLISH)
        stamped.setdefault(headers.CONVERSATION_ID, str(uuid.uuid4()))
        stamped.setdefault(headers.ORIGINATING_ENDPOINT, self.name)
        stamped.setdefault(headers.ORIGINATING_MACHINE, self.machine)
        stamped.setdefault(headers.REPLY_TO_ADDRESS, self.address_text)
        return self.transport.publish(
            dataclasses.replace(outgoing, headers=stamped), connection, type_names=self._names
        )

    def event_message(self, event: Outgoing) -> OutgoingMessage:
        """*event* as an OutgoingMessage whose type headers a publish fills in."""
        if hasattr(event, "model_dump_json") and not isinstance(event, OutgoingMessage):
            return OutgoingMessage(event)
        return self.outgoing(event)

    def type_name(self, model: type[Any]) -> str | None:
        """The type name *model* was registered under, if it was."""
        return self._names.get(model)

    def outgoing(self, message: Outgoing) -> OutgoingMessage:
        """*message* as an OutgoingMessage (a model registered with a .NET name carries it)."""
        if isinstance(message, OutgoingMessage):
            return message
        if isinstance(message, bytes | str):
            return OutgoingMessage(message)
        if hasattr(message, "model_dump_json"):
            registered = self._names.get(type(message))
            extra = {headers.ENCLOSED_MESSAGE_TYPES: registered} if registered else {}
            return OutgoingMessage(message, headers=extra)
        raise exceptions.InvalidMessage(
            f"cannot send {message!r}: give an OutgoingMessage, a pydantic model, bytes or str"
        )

    def invoke(self, context: HandlerContext) -> None:
        """Run every handler that accepts the context's message, in registration order.

        :raises UnknownMessageType: none does.
        """
        instrumentation = self._instrumentation or self.transport.instrumentation
        if instrumentation is not None:
            queue = self.transport._table_queue(self.name).name
            instrumentation.handle(queue, context.message, lambda: self._invoke(context))
            return
        self._invoke(context)

    def invoker(self) -> Callable[[HandlerContext], None]:
        """:meth:`invoke`, shortened for the handlers registered now (a batch's dispatch).

        Without instrumentation: the dispatch itself, and with one raw handler and no typed
        one, that handler's call.
        """
        if self._instrumentation is not None or self.transport.instrumentation is not None:
            return self.invoke
        raws = self._raw
        if self._typed or len(raws) != 1:
            return self._invoke
        raw = raws[0]

        def invoke_raw(context: HandlerContext) -> None:
            raw(context.message.body or b"", context)

        return invoke_raw

    def _invoke(self, context: HandlerContext) -> None:
        message = context.message
        matched = None
        if self._typed:  # raw handlers alone need no type lookup
            for entry in (message.headers.get(headers.ENCLOSED_MESSAGE_TYPES) or "").split(";"):
                matched = self._typed.get(full_type_name(entry))
                if matched is not None:
                    break
        if matched is None and not self._raw:
            raise exceptions.UnknownMessageType(
                message.message_id, message.headers.get(headers.ENCLOSED_MESSAGE_TYPES)
            )
        if matched is not None:
            model, handlers = matched
            body = message.model(model)
            for handler in list(handlers):
                handler(body, context)
        raws = self._raw
        if raws:
            raw_body = message.body or b""
            for raw in raws:
                raw(raw_body, context)

    # -- running ---------------------------------------------------------------------------
    @property
    def stats(self) -> pump.PumpStats:
        """Counters of the running (or last) pump of the input queue: received, handled, ..."""
        return self._pump.stats if self._pump is not None else pump.PumpStats()

    @property
    def instance_stats(self) -> pump.PumpStats:
        """The same counters for the instance-specific queue (zero without one)."""
        current = self._instance_pump
        return current.stats if current is not None else pump.PumpStats()

    def _pumps(self) -> list[pump.MessagePump]:
        return [each for each in (self._pump, self._instance_pump) if each is not None]

    def start(self) -> None:
        """Check the configuration, create the queues if asked, and start the pump threads.

        :raises ConfigurationError: a mode the databases cannot honour (see docs/endpoint.md).
        """
        with self._lock:
            if self._pump is not None and self._pump.running:
                raise exceptions.SqlQueueError(f"endpoint {self.name!r} is already running")
            strategy = strategies.for_endpoint(self)
            instance = self.instance_address
            queues: list[str | addressing.QueueAddress] = [self.name]
            if instance is not None:
                queues.append(instance)
            if self.settings.create_queues:
                for queue in queues:
                    self.transport.create_queue(queue)
                self.transport.create_queue(self.settings.error_queue)
                if self.settings.delayed_delivery:
                    self.transport.create_delayed_table(self.name)
                if self.settings.audit_queue is not None:
                    self.transport.create_queue(self.settings.audit_queue)
            strategy.prepare()
            if self.settings.create_queues:
                self.transport.create_subscription_table()
            if self.settings.auto_subscribe:
                for event_type in self._events:
                    self.subscribe(event_type)
            notify = (
                self.settings.notify and dialects.for_dialect(self.transport.engine).listen_notify
            )
            for queue in queues:
                if self.settings.purge_expired_at_startup:
                    self.transport.purge_expired(queue)
                if notify:
                    wakeup.install_trigger(self.transport.engine, self.transport._address(queue))
            self._pump = pump.MessagePump(self, strategy)
            self._instance_pump = None
            if instance is not None:
                self._instance_pump = pump.MessagePump(
                    self,
                    strategies.for_endpoint(self, instance),
                    concurrency=self.settings.instance_concurrency,
                )
            for each in self._pumps():
                each.start(notify=notify)
            if self.settings.delayed_delivery:
                self._mover = mover.DelayedMessageMover(self)
                self._mover.start()
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

    def stop(self, timeout: float | None = None) -> bool:
        """Stop taking messages and let in-flight handlers finish within *timeout* seconds.

        Default: ``settings.shutdown_timeout``. What is still running then is rolled back (its
        connection is closed under it), so its message returns to the queue. Return whether
        everything finished in time.
        """
        pumps = self._pumps()
        limit = self.settings.shutdown_timeout if timeout is None else timeout
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

        Signal handlers are installed only when called from the main thread; the previous
        ones are restored on return.
        """
        with self._signals():
            self.start()
            assert self._pump is not None
            if once:
                for each in self._pumps():  # the input queue and the instance-specific one
                    while not each.drained.wait(0.1) and each.running:
                        pass  # a signal's stop ends the wait too
                self.stop()
            self.wait()

    @contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("queue %s: %s received; stopping", self.name, signal.Signals(signum).name)
            threading.Thread(target=self.stop, name=f"stop {self.name}", daemon=True).start()

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

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- for the strategies ----------------------------------------------------------------
    @property
    def instrumentation(self) -> Instrumentation | None:
        """The endpoint's instrumentation, else its transport's (None: nothing is traced)."""
        return self._instrumentation or self.transport.instrumentation

    @property
    def mode(self) -> TransactionMode:
        """The transaction mode of the settings."""
        return self.settings.transaction_mode

    def failure_headers(
        self, message: IncomingMessage, error: BaseException
    ) -> dict[str, str | None]:
        """The headers NServiceBus adds to a message it moves to the error queue.

        ``FailedQ`` is the queue the message was received from: the input queue, or the
        instance-specific one.
        """
        failed_queue = self.address_text
        instance = self.instance_address
        if instance is not None and message.queue == str(self.transport._address(instance)):
            failed_queue = self.transport.address_text(instance)
        return forwarding.failure_headers(failed_queue, self.name, self.machine, error)
