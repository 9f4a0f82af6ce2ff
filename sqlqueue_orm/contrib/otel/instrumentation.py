"""OpenTelemetryInstrumentation: the core's hooks as OpenTelemetry spans and metrics.

What it records and why it is shaped so is in the package docstring and ``docs/observability.md``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from sqlqueue_orm import headers
from sqlqueue_orm import instrumentation as core

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage

T = TypeVar("T")

#: The name of the tracer and of the meter.
SCOPE_NAME = "sqlqueue_orm"
#: ``messaging.system`` of every span (the conventions allow a system's own name).
SYSTEM = "sqlqueue_orm"
#: NServiceBus's header asking the receiver to start a new trace linked to the sender's.
START_NEW_TRACE = "NServiceBus.OpenTelemetry.StartNewTrace"
#: The W3C header of the sender's span, which NServiceBus 8+ writes and reads.
TRACE_PARENT = "traceparent"
#: NServiceBus 10.3+'s own copy of it (preferred by its receivers; it writes both).
NSERVICEBUS_TRACE_PARENT = "NServiceBus.TraceParent"
#: NServiceBus's scheduled delivery time (critical time counts from it when present).
DELIVER_AT = "NServiceBus.DeliverAt"
#: The tag of the queue on every metric, as NServiceBus names it.
QUEUE_TAG = "nservicebus.queue"
MESSAGE_TYPE_TAG = "nservicebus.message_type"
ERROR_TYPE_TAG = "error.type"


def _operation(queue: str, operation: str) -> dict[str, AttributeValue]:
    """The attributes of a span of *operation* (``send``, ``receive``, ``process``) on *queue*."""
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }


def _message_type(message: IncomingMessage) -> str | None:
    """The full type name of the first ``EnclosedMessageTypes`` entry (no assembly)."""
    enclosed = message.headers.get(headers.ENCLOSED_MESSAGE_TYPES)
    if not enclosed:
        return None
    return enclosed.split(";", 1)[0].split(",", 1)[0].strip() or None


def _sender_context(message: IncomingMessage) -> Context:
    """The context the sender wrote into *message*'s headers (empty if none, or unreadable).

    NServiceBus 10.3+ writes its send span twice: ``NServiceBus.TraceParent`` and the W3C
    ``traceparent`` (which a broker SDK may overwrite with its own span). As its receivers do,
    the NServiceBus header wins when present, even unreadable (then there is no sender
    context); ``tracestate`` and ``baggage`` come from their W3C headers either way.
    """
    carrier = {key: value for key, value in message.headers.items() if value is not None}
    own = carrier.get(NSERVICEBUS_TRACE_PARENT)
    if own is not None:
        carrier[TRACE_PARENT] = own
    return propagate.extract(carrier)


def _sent_at(message: IncomingMessage) -> dt.datetime | None:
    for name in (DELIVER_AT, headers.TIME_SENT):
        text = message.headers.get(name)
        if text:
            try:
                return headers.parse_time(text)
            except ValueError:
                continue
    return None


class OpenTelemetryInstrumentation(core.NoInstrumentation):
    """Spans and metrics of every hook, through the given (default: global) providers.

    :param tracer_provider: where the spans go; default the global one.
    :param meter_provider: where the metrics go; default the global one.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE_NAME, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE_NAME, meter_provider=meter_provider)
        self.fetches = meter.create_counter(
            "nservicebus.messaging.fetches",
            unit="{message}",
            description="Messages fetched from the queue by the endpoint.",
        )
        self.successes = meter.create_counter(
            "nservicebus.messaging.successes",
            unit="{message}",
            description="Messages processed successfully by the endpoint.",
        )
        self.failures = meter.create_counter(
            "nservicebus.messaging.failures",
            unit="{message}",
            description="Processing attempts that failed (each immediate retry counts).",
        )
        self.processing_time = meter.create_histogram(
            "nservicebus.messaging.processing_time",
            unit="s",
            description="Seconds from the receive of a message to the end of its handlers.",
        )
        self.critical_time = meter.create_histogram(
            "nservicebus.messaging.critical_time",
            unit="s",
            description="Seconds from the send (or DeliverAt) to the end of the handlers.",
        )
        self.handler_time = meter.create_histogram(
            "nservicebus.messaging.handler_time",
            unit="s",
            description="Seconds the handlers of one message ran.",
        )
        self.immediate_retries = meter.create_counter(
            "nservicebus.recoverability.immediate",
            unit="{message}",
            description="Immediate retries.",
        )
        self.delayed_retries = meter.create_counter(
            "nservicebus.recoverability.delayed",
            unit="{message}",
            description="Delayed retries (sent to the delayed table to be tried again later).",
        )
        self.moved_to_error = meter.create_counter(
            "nservicebus.recoverability.error",
            unit="{message}",
            description="Messages moved to the error queue.",
        )
        self.dispatched_records = meter.create_counter(
            "sqlqueue.outbox.dispatched",
            unit="{record}",
            description="Outbox records dispatched.",
        )
        self.delayed_moved = meter.create_counter(
            "sqlqueue.delayed.moved",
            unit="{message}",
            description="Delayed messages moved to their queue when due.",
        )
        self._depths: dict[str, int] = {}
        self._backlogs: dict[str, int] = {}
        meter.create_observable_gauge(
            "sqlqueue.queue.depth",
            callbacks=[self._observe_depths],
            unit="{message}",
            description="Messages in the queue, as its last peek estimated them.",
        )
        meter.create_observable_gauge(
            "sqlqueue.outbox.backlog",
            callbacks=[self._observe_backlogs],
            unit="{record}",
            description="Outbox records not dispatched yet, as the last dispatch counted them.",
        )
        # The receive and the handlers of one message run on one worker thread: the receive
        # notes when it took each message, for the processing time.
        self._local = threading.local()

    # -- sending ---------------------------------------------------------------------------
    # The hooks repeat the signatures of sqlqueue_orm.instrumentation.Instrumentation on
    # purpose: this class implements that protocol, checked against it by mypy.
    def send(
        self,
        queue: str,
        messages: Sequence[OutgoingMessage],
        proceed: Callable[[Sequence[OutgoingMessage]], list[str]],
    ) -> list[str]:
        """A ``send {queue}`` span; each message carries its context in its headers."""
        attributes = _operation(queue, "send")
        with self.tracer.start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            context = span.get_span_context()
            own = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            traced = []
            for message in messages:
                carrier = dict(message.headers)
                propagate.inject(carrier)  # traceparent, tracestate, baggage: this span's
                carrier[NSERVICEBUS_TRACE_PARENT] = own
                message_id = message.message_id or message.headers.get(headers.MESSAGE_ID)
                message_id = message_id or str(uuid.uuid4())
                traced.append(dataclasses.replace(message, headers=carrier, message_id=message_id))
            if len(traced) == 1:
                span.set_attribute("messaging.message.id", traced[0].message_id or "")
                conversation = traced[0].headers.get(headers.CONVERSATION_ID)
                if conversation:
                    span.set_attribute("messaging.message.conversation_id", conversation)
            else:
                span.set_attribute("messaging.batch.message_count", len(traced))
            return proceed(traced)

    # -- receiving -------------------------------------------------------------------------
    def receive(
        self, queue: str, proceed: Callable[[], list[IncomingMessage]]
    ) -> list[IncomingMessage]:
        """A ``receive {queue}`` span linked to each message's context; counts the fetches."""
        attributes = _operation(queue, "receive")
        with self.tracer.start_as_current_span(
            f"receive {queue}", kind=SpanKind.CONSUMER, attributes=attributes
        ) as span:
            messages = proceed()
            span.set_attribute("messaging.batch.message_count", len(messages))
            taken = time.monotonic()
            received: dict[uuid.UUID, float] = {}
            for message in messages:
                received[message.id] = taken
                sender = trace.get_current_span(_sender_context(message))
                context = sender.get_span_context()
                if context.is_valid:
                    span.add_link(context, {"messaging.message.id": message.message_id})
            if len(messages) == 1:
                span.set_attribute("messaging.message.id", messages[0].message_id)
            self._local.received = received
        if messages:
            self.fetches.add(len(messages), {QUEUE_TAG: queue})
        return messages

    def handle(self, queue: str, message: IncomingMessage, proceed: Callable[[], None]) -> None:
        """A ``process {queue}`` span, the child of the sender's; times and counts the run."""
        parent = _sender_context(message)
        links: list[Link] = []
        if (message.headers.get(START_NEW_TRACE) or "").lower() == "true":
            sender = trace.get_current_span(parent).get_span_context()
            if sender.is_valid:
                links.append(Link(sender))
            parent = Context()
        attributes = _operation(queue, "process")
        attributes["messaging.message.id"] = message.message_id
        conversation = message.headers.get(headers.CONVERSATION_ID)
        if conversation:
            attributes["messaging.message.conversation_id"] = conversation
        if message.body is not None:
            attributes["messaging.message.body.size"] = len(message.body)
        tags: dict[str, AttributeValue] = {QUEUE_TAG: queue}
        message_type = _message_type(message)
        if message_type:
            attributes[MESSAGE_TYPE_TAG] = message_type
            tags[MESSAGE_TYPE_TAG] = message_type
        received = getattr(self._local, "received", None) or {}
        taken = received.pop(message.id, None)
        started = time.monotonic()
        # The incoming context is made current (not only the parent) so its baggage goes on
        # with what the handlers send, as NServiceBus carries it.
        token = otel_context.attach(parent)
        try:
            self._process(queue, proceed, parent, links, attributes, tags, started)
        finally:
            otel_context.detach(token)
        ended = time.monotonic()
        self.handler_time.record(ended - started, {**tags, "execution.result": "success"})
        self.processing_time.record(ended - (taken if taken is not None else started), tags)
        sent_at = _sent_at(message)
        if sent_at is not None:
            critical = (dt.datetime.now(dt.UTC) - sent_at).total_seconds()
            self.critical_time.record(max(0.0, critical), tags)

    def _process(
        self,
        queue: str,
        proceed: Callable[[], None],
        parent: Context,
        links: list[Link],
        attributes: dict[str, AttributeValue],
        tags: dict[str, AttributeValue],
        started: float,
    ) -> None:
        """The ``process`` span around *proceed*; a failure is recorded, counted and raised."""
        with self.tracer.start_as_current_span(
            f"process {queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                proceed()
            except BaseException as error:
                ended = time.monotonic()
                error_type = f"{type(error).__module__}.{type(error).__qualname__}"
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                span.set_attribute(ERROR_TYPE_TAG, error_type)
                failed = {**tags, ERROR_TYPE_TAG: error_type}
                self.failures.add(1, failed)
                self.handler_time.record(ended - started, {**failed, "execution.result": "failure"})
                raise

    def outcome(self, queue: str, outcome: str) -> None:
        """Count successes (after the commit), immediate and delayed retries, error-queue moves."""
        tags: dict[str, AttributeValue] = {QUEUE_TAG: queue}
        if outcome == "handled":
            self.successes.add(1, tags)
        elif outcome == "retried":
            self.immediate_retries.add(1, tags)
        elif outcome == "delayed":
            self.delayed_retries.add(1, tags)
        elif outcome in ("failed", "poison"):
            self.moved_to_error.add(1, tags)

    def peeked(self, queue: str, count: int) -> None:
        """Keep the depth for the ``sqlqueue.queue.depth`` gauge."""
        self._depths[queue] = count

    # -- outbox and delayed delivery -------------------------------------------------------
    def dispatch(self, outbox: str, proceed: Callable[[], T]) -> T:
        """A ``dispatch {outbox}`` span for a batch that claimed records (idle polls: none)."""
        return self._span_if_busy(f"dispatch {outbox}", outbox, "dispatch", proceed)

    def dispatched(self, outbox: str, records: int, messages: int, backlog: int) -> None:
        """Count the records dispatched; keep the backlog for its gauge."""
        self._backlogs[outbox] = backlog
        if records:
            self.dispatched_records.add(records, {"sqlqueue.outbox": outbox})

    def move_delayed(self, queue: str, proceed: Callable[[], int]) -> int:
        """A ``move {queue}`` span when due delayed messages moved; count them."""
        moved = self._span_if_busy(f"move {queue}", queue, "move", proceed)
        if moved:
            self.delayed_moved.add(moved, {QUEUE_TAG: queue})
        return moved

    def _span_if_busy(self, name: str, target: str, operation: str, proceed: Callable[[], T]) -> T:
        """Run *proceed*; record a span of its run only if it did something (or failed)."""
        started = time.time_ns()
        attributes: dict[str, AttributeValue] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": target,
            "messaging.operation.name": operation,
        }
        try:
            result = proceed()
        except BaseException as error:
            span = self.tracer.start_span(name, attributes=attributes, start_time=started)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()
            raise
        busy = _busy_attributes(result)
        if busy:
            span = self.tracer.start_span(name, attributes=attributes, start_time=started)
            span.set_attributes(busy)
            span.end()
        return result

    # -- gauges ----------------------------------------------------------------------------
    def _observe_depths(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {QUEUE_TAG: queue}) for queue, count in dict(self._depths).items()
        ]

    def _observe_backlogs(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {"sqlqueue.outbox": outbox})
            for outbox, count in dict(self._backlogs).items()
        ]


def _busy_attributes(result: object) -> dict[str, AttributeValue]:
    """What an operation did, as span attributes; empty when it did nothing (no span then).

    A move returns how many messages it moved; a dispatch returns its report (records claimed,
    messages sent per queue).
    """
    if isinstance(result, int):
        return {"messaging.batch.message_count": result} if result else {}
    claimed = getattr(result, "claimed", 0)
    if not isinstance(claimed, int) or not claimed:
        return {}
    messages = getattr(result, "messages", None)
    sent = sum(messages.values()) if isinstance(messages, Counter) else 0
    return {"messaging.batch.message_count": sent, "sqlqueue.outbox.records": claimed}


def instrument(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> OpenTelemetryInstrumentation:
    """Instrument every transport and endpoint of the process (made before or after); return it.

    :func:`sqlqueue_orm.instrumentation.set_instrumentation` with an
    :class:`OpenTelemetryInstrumentation` of these (default: the global) providers.
    """
    instrumentation = OpenTelemetryInstrumentation(tracer_provider, meter_provider)
    core.set_instrumentation(instrumentation)
    return instrumentation
