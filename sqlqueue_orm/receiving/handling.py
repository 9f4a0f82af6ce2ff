"""What handlers get and how they are found: :class:`Handling` and :class:`HandlerContext`.

:class:`Handling` is an endpoint's handling, apart from its running: its identity (name,
transport, settings, machine), the handlers registered per message type, and what their
sends carry. The :class:`~sqlqueue_orm.receiving.endpoint.Endpoint` registers handlers on it,
and the transaction modes (:mod:`sqlqueue_orm.receiving.modes`) run them through it.

Handlers are registered per pydantic model and matched through the
``NServiceBus.EnclosedMessageTypes`` header: its first entry whose full type name (the part
before the first comma of a .NET assembly-qualified name) is registered wins. Several handlers
of one type run in registration order, in the same transaction; raw handlers then run for every
message. A message nothing accepts is a processing failure
(:class:`~sqlqueue_orm.exceptions.UnknownMessageType`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlqueue_orm import addressing, exceptions, headers
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.pubsub import publishing
from sqlqueue_orm.pubsub import topics as topic_names
from sqlqueue_orm.receiving.circuit_breaker import Outage
from sqlqueue_orm.receiving.settings import EndpointSettings, TransactionMode

if TYPE_CHECKING:
    import pydantic
    from sqlalchemy.orm import Session

    from sqlqueue_orm.instrumentation import Instrumentation
    from sqlqueue_orm.receiving.scope import MessageScope
    from sqlqueue_orm.sending.outbox import Outbox
    from sqlqueue_orm.transport import Transport

#: ``NServiceBus.RelatedTo``: the id of the message being handled when this one was sent.
RELATED_TO = "NServiceBus.RelatedTo"

ModelT = TypeVar("ModelT", bound="pydantic.BaseModel")
TypedHandler = Callable[[Any, "HandlerContext"], object]
RawHandler = Callable[[bytes, "HandlerContext"], object]
Sender = Callable[[str | addressing.QueueAddress, OutgoingMessage], str]
Outgoing = OutgoingMessage | bytes | str | Any


def refuse_async(handler: Callable[..., object]) -> None:
    """Refuse *handler* if calling it only makes a coroutine or an async generator.

    Handlers run synchronously: such a handler's body would never run, and its message would
    count as handled. Looks through ``functools.partial`` and at an object's ``__call__``.

    :raises ConfigurationError: *handler* is asynchronous.
    """
    target: object = handler
    while isinstance(target, functools.partial):
        target = target.func
    call = target if inspect.isroutine(target) else getattr(target, "__call__", None)  # noqa: B004
    if inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        name = getattr(target, "__qualname__", None) or repr(target)
        raise exceptions.ConfigurationError(
            f"handler {name} is asynchronous; handlers must be plain functions "
            "(run a coroutine with asyncio.run inside one)"
        )


def awaitable_returned(handler: Callable[..., object], result: object) -> None:
    """Fail a message whose *handler* returned an awaitable (its work never ran).

    The coroutine is closed, so it does not warn that it was never awaited.

    :raises TypeError: *result* is awaitable.
    """
    close = getattr(result, "close", None)
    if inspect.iscoroutine(result) and callable(close):
        close()
    name = getattr(handler, "__qualname__", None) or repr(handler)
    raise TypeError(
        f"handler {name} returned an awaitable ({type(result).__name__}), which was not run; "
        "handlers must finish their work before they return"
    )


def full_type_name(entry: str) -> str:
    """The full type name of one ``EnclosedMessageTypes`` entry (no assembly, version, key)."""
    return entry.split(",", 1)[0].strip()


class Handling:
    """An endpoint's identity and handlers, what its receives and its handlers' sends need.

    :param name: the endpoint's name, which is its input queue.
    :param transport: the :class:`Transport` of its queues.
    :param settings: its :class:`EndpointSettings`.
    :param user_transport: the transport of the database the handlers' ORM session writes to.
    :param outbox: the outbox of mode OUTBOX, or None (the modes make one).
    :param on_critical_error: called when peeking or receiving fails for too long.
    :param instrumentation: the endpoint's own instrumentation, else the transport's is used.
    """

    def __init__(
        self,
        name: str,
        transport: Transport,
        settings: EndpointSettings,
        user_transport: Transport,
        outbox: Outbox | None = None,
        on_critical_error: Callable[[str, BaseException], object] | None = None,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        self.name = name
        self.transport = transport
        self.settings = settings
        self.user_transport = user_transport
        self.outbox = outbox
        self.on_critical_error = on_critical_error
        #: What its circuit breakers share, so that an outage raises the critical error once.
        self.outage = Outage()
        self._instrumentation = instrumentation
        self.machine = socket.gethostname()
        self._typed: dict[str, tuple[type[Any], list[TypedHandler]]] = {}
        self._names: dict[type[Any], str] = {}
        #: The models registered as events this endpoint subscribes to.
        self.events: list[type[Any]] = []
        #: Replaced, not changed, on registration: a pump reading it needs no copy.
        self._raw: tuple[RawHandler, ...] = ()
        self._lock = threading.Lock()

    @functools.cached_property
    def address_text(self) -> str:
        """The input queue's address as the .NET transport writes it (``ReplyToAddress``).

        Read on first use, not when the endpoint is made: on PostgreSQL it names the default
        schema, which the first connection tells (an asyncio engine's only inside the bridge).
        """
        return self.transport.address_text(self.name)

    # -- registration ----------------------------------------------------------------------
    def register(
        self, model: type[Any], name: str, default: str, function: TypedHandler, event: bool
    ) -> None:
        """Register *function* for *model* under *name* (and its Python name *default*).

        :raises ConfigurationError: *function* is asynchronous, or *name* belongs to another model.
        """
        refuse_async(function)
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
            if event and model not in self.events:
                self.events.append(model)

    def register_raw(self, handler: RawHandler) -> None:
        """Register *handler* for every message.

        :raises ConfigurationError: *handler* is asynchronous.
        """
        refuse_async(handler)
        with self._lock:
            self._raw = (*self._raw, handler)

    def map_type(self, model: type[Any], name: str) -> None:
        """Send and publish *model* as the .NET type *name*."""
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

    # -- what sends carry ------------------------------------------------------------------
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
        shared = self.transport.queues.address(self.name)
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

    def event_message(self, event: Outgoing) -> OutgoingMessage:
        """*event* as an OutgoingMessage whose type headers a publish fills in."""
        if hasattr(event, "model_dump_json") and not isinstance(event, OutgoingMessage):
            return OutgoingMessage(event)
        return self.outgoing(event)

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

    # -- running the handlers --------------------------------------------------------------
    @property
    def instrumentation(self) -> Instrumentation | None:
        """The endpoint's instrumentation, else its transport's (None: nothing is traced)."""
        return self._instrumentation or self.transport.instrumentation

    def context(
        self, message: IncomingMessage, sender: Sender, session: Callable[[], Session]
    ) -> HandlerContext:
        """The context of *message*'s handlers: sends through *sender*, *session* on first use."""
        return HandlerContext(self, message, sender, session)

    def scoped_context(self, message: IncomingMessage, scope: MessageScope) -> ScopedContext:
        """The context of a message handled in *scope* (its sends and its session)."""
        return ScopedContext(self, message, scope)

    def invoke(self, context: HandlerContext) -> None:
        """Run every handler that accepts the context's message, in registration order.

        :raises UnknownMessageType: none does.
        """
        instrumentation = self._instrumentation or self.transport.instrumentation
        if instrumentation is not None:
            queue = self.transport.queues.table_queue(self.name).name
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
            result = raw(context.message.body or b"", context)
            if result is not None and inspect.isawaitable(result):
                awaitable_returned(raw, result)

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
                result = handler(body, context)
                if result is not None and inspect.isawaitable(result):
                    awaitable_returned(handler, result)
        raws = self._raw
        if raws:
            raw_body = message.body or b""
            for raw in raws:
                result = raw(raw_body, context)
                if result is not None and inspect.isawaitable(result):
                    awaitable_returned(raw, result)


class MessageView:
    """The id and headers of :attr:`message`, the message a handler's context is about.

    Shared by the :class:`HandlerContext` and the asyncio endpoint's context, which reads its
    message from the synchronous one.
    """

    __slots__ = ()

    #: The message being handled, as it was received (set by the subclass).
    message: IncomingMessage

    @property
    def message_id(self) -> str:
        """``NServiceBus.MessageId`` of the message being handled."""
        return self.message.message_id

    @property
    def headers(self) -> dict[str, str | None]:
        """The headers of the message being handled."""
        return self.message.headers


class HandlerContext(MessageView):
    """What a handler gets besides its message: ids, headers, session, send and reply.

    ``session`` is an ORM :class:`~sqlalchemy.orm.Session` bound as the transaction mode
    dictates (the receive's own transaction in TRANSACTION_SCOPE, the unit of work's in OUTBOX,
    a transaction of its own, committed after the handlers, otherwise). ``send`` and ``reply``
    go out as the mode dictates (see ``docs/endpoint.md``).
    """

    def __init__(
        self,
        handling: Handling,
        message: IncomingMessage,
        sender: Sender,
        session_factory: Callable[[], Session],
    ) -> None:
        self._handling = handling
        #: The message being handled, as it was received.
        self.message = message
        self._sender = sender
        self._session_factory = session_factory
        #: The session if a handler used it, else None (for the transaction modes).
        self.session_used: Session | None = None

    @property
    def session(self) -> Session:
        """The ORM session of this message's handling (made on first use)."""
        session = self.session_used
        if session is None:
            session = self.session_used = self._session_factory()
        return session

    def deferred_session(self) -> Session:
        """:attr:`session`, made without a statement (where none can run: on the event loop)."""
        return self.session

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
        outgoing = self._handling.outgoing(message)
        if reply_to_this_instance:
            outgoing = self._handling.reply_to_instance(outgoing)
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
        outgoing = self._handling.outgoing(message)
        reply_headers = dict(outgoing.headers)
        reply_headers.setdefault(
            headers.CORRELATION_ID,
            self.message.headers.get(headers.CORRELATION_ID) or self.message_id,
        )
        outgoing = dataclasses.replace(outgoing, headers=reply_headers)
        destination = self._handling.transport.queues.address(address_text)
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
        if self._handling.settings.transaction_mode is TransactionMode.OUTBOX:
            raise exceptions.ConfigurationError(
                f"endpoint {self._handling.name!r}: defer is not supported in mode OUTBOX yet; "
                "send it from a handler of another mode or after the unit of work"
            )
        outgoing = self._stamp(self._handling.outgoing(message), "Send")
        target = self._handling.name if destination is None else destination
        return self._deferring_sender(target, outgoing, delay, deliver_at)

    def _deferring_sender(
        self,
        destination: str | addressing.QueueAddress,
        outgoing: OutgoingMessage,
        delay: dt.timedelta | float | None,
        deliver_at: dt.datetime | None,
    ) -> str:
        connection = getattr(self._sender, "connection", None)
        return self._handling.transport.send(
            destination,
            outgoing,
            connection=connection,
            delay=delay,
            deliver_at=deliver_at,
            endpoint=self._handling.name,
        )

    def publish(self, event: Outgoing) -> str:
        """Publish *event* to every subscriber of its type and base types, as the mode sends.

        One copy per distinct subscribed queue, each sent as :meth:`send` sends (in the
        receive's transaction, the outbox, or at once, as the mode dictates), with
        ``MessageIntent: Publish`` and the headers :meth:`send` sets. Return its message id.
        """
        handling = self._handling
        outgoing = self._stamp(handling.event_message(event), publishing.PUBLISH)
        outgoing, topics = publishing.prepare(outgoing, handling.type_names)
        assert outgoing.message_id is not None
        transport = handling.transport
        subscribers = transport.subscriptions.subscribers(topics)
        addresses = (transport.queues.address(text) for text in subscribers)
        # One copy per distinct queue, however each subscription spells it.
        schema = transport.engine.dialect.default_schema_name
        for destination in publishing.one_per_table(addresses, schema):
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
        handling = self._handling
        stamped.setdefault(headers.ORIGINATING_ENDPOINT, handling.name)
        stamped.setdefault(headers.ORIGINATING_MACHINE, handling.machine)
        stamped.setdefault(headers.REPLY_TO_ADDRESS, handling.address_text)
        return dataclasses.replace(outgoing, headers=stamped)  # the caller's message unchanged


class ScopedContext(HandlerContext):
    """A :class:`HandlerContext` whose sender also makes its session (one object less each).

    The context of a TRANSACTION_SCOPE message: its scope sends in the receive's transaction
    and makes the session inside the message's SAVEPOINT.
    """

    def __init__(self, handling: Handling, message: IncomingMessage, scope: MessageScope) -> None:
        self._handling = handling
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

    def deferred_session(self) -> Session:
        """:attr:`session`, its SAVEPOINT opened when it first reaches the database."""
        session = self.session_used
        if session is None:
            session = self.session_used = self._scope.deferred_session()
        return session
