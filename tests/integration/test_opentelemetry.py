"""OpenTelemetry: a request/reply conversation is one trace across two endpoints; metrics count it.

Spans are read from the SDK's ``InMemorySpanExporter`` and metrics from its
``InMemoryMetricReader``; every message goes through a real queue table. Each test gives its
transports an instrumentation of its own providers (never the global ones), so tests do not see
each other's spans.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sqlqueue_orm import OutgoingMessage, Transport, UnitOfWork, instrumentation
from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.contrib.otel import OpenTelemetryInstrumentation
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox

#: A traceparent and tracestate as a .NET NServiceBus 8+ sender writes them into the headers
#: (the W3C specification's example values).
DOTNET_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
DOTNET_SPAN_ID = "00f067aa0ba902b7"
DOTNET_TRACEPARENT = f"00-{DOTNET_TRACE_ID}-{DOTNET_SPAN_ID}-01"
DOTNET_TRACESTATE = "congo=t61rcWkgMzE"
#: What a broker SDK may overwrite ``traceparent`` with (NServiceBus 10.3+ keeps its own span in
#: ``NServiceBus.TraceParent`` for that reason, and its receivers prefer it).
SDK_TRACEPARENT = f"00-{DOTNET_TRACE_ID}-b7ad6b7169203331-01"


class PlaceOrder(pydantic.BaseModel):
    number: int
    fail: bool = False


class OrderPlaced(pydantic.BaseModel):
    number: int


class Telemetry:
    """An SDK tracer and meter provider with in-memory exporters, and the instrumentation."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.instrumentation = OpenTelemetryInstrumentation(
            self.tracer_provider, self.meter_provider
        )

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [
            span
            for span in self.spans.get_finished_spans()
            if name is None or span.name == name
        ]

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> its data points (all scopes, all resources)."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def total(self, name: str, **tags: str) -> float:
        points = self.metrics().get(name, [])
        matching = [p for p in points if all(p.attributes.get(k) == v for k, v in tags.items())]
        return sum(getattr(p, "value", getattr(p, "count", 0)) for p in matching)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    yield telemetry
    telemetry.tracer_provider.shutdown()
    telemetry.meter_provider.shutdown()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def settings(**changes: Any) -> EndpointSettings:
    base = EndpointSettings(
        concurrency=1,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1,
        immediate_retries=1,
        delayed_retries=0,
        shutdown_timeout=5,
    )
    return base.replace(**changes)


def test_a_request_reply_conversation_is_one_trace_across_both_endpoints(database, telemetry):
    """send -> receive/process on the server -> reply send -> receive/process on the client."""
    # Two transports, as two processes would have, traced into the same in-memory exporter.
    client_transport = database.transport(instrumentation=telemetry.instrumentation)
    server_transport = database.transport(instrumentation=telemetry.instrumentation)
    client = Endpoint("client", client_transport, settings=settings())
    server = Endpoint("server", server_transport, settings=settings())
    replies: list[int] = []

    @server.handle(PlaceOrder, type_name="Sales.PlaceOrder")
    def place(order: PlaceOrder, context: HandlerContext) -> None:
        context.reply(OrderPlaced(number=order.number))

    @client.handle(OrderPlaced, type_name="Sales.OrderPlaced")
    def placed(event: OrderPlaced, context: HandlerContext) -> None:
        replies.append(event.number)

    client_transport.create_queue("client")
    server_transport.create_queue("server")
    request_id = client.send("server", PlaceOrder(number=7))
    client.start()
    server.start()
    try:
        wait_for(lambda: replies == [7], "the reply")
        wait_for(lambda: len(telemetry.finished("process client")) == 1, "the client's span")
    finally:
        assert client.stop(5) and server.stop(5)

    [request_send] = telemetry.finished("send server")
    # The reply goes to the ReplyToAddress header, which names the queue as the transport writes
    # addresses (schema-qualified on PostgreSQL, as .NET does).
    reply_queue = client_transport.queues.table_queue(client_transport.address_text("client")).name
    [reply_send] = telemetry.finished(f"send {reply_queue}")
    [server_process] = telemetry.finished("process server")
    [client_process] = telemetry.finished("process client")
    server_receives = [s for s in telemetry.finished("receive server") if _count(s) == 1]
    client_receives = [s for s in telemetry.finished("receive client") if _count(s) == 1]
    assert len(server_receives) == 1 and len(client_receives) == 1

    # One trace, parent to child: send -> process -> reply send -> process.
    trace_id = request_send.context.trace_id
    conversation = [request_send, server_process, reply_send, client_process]
    assert {span.context.trace_id for span in conversation} == {trace_id}
    assert request_send.parent is None
    assert server_process.parent.span_id == request_send.context.span_id
    assert reply_send.parent.span_id == server_process.context.span_id
    assert client_process.parent.span_id == reply_send.context.span_id
    # Each receive is linked to the send of the message it took.
    assert [link.context.span_id for link in server_receives[0].links] == [
        request_send.context.span_id
    ]
    assert [link.context.span_id for link in client_receives[0].links] == [
        reply_send.context.span_id
    ]

    # Kinds and the messaging conventions' attributes.
    assert request_send.kind is SpanKind.PRODUCER and server_process.kind is SpanKind.CONSUMER
    assert request_send.attributes["messaging.destination.name"] == "server"
    assert request_send.attributes["messaging.operation.type"] == "send"
    assert request_send.attributes["messaging.message.id"] == request_id
    assert server_process.attributes["messaging.operation.type"] == "process"
    assert server_process.attributes["messaging.message.id"] == request_id
    assert server_receives[0].attributes["messaging.operation.type"] == "receive"
    conversation_ids = {
        span.attributes["messaging.message.conversation_id"]
        for span in (request_send, server_process, reply_send, client_process)
    }
    assert len(conversation_ids) == 1 and None not in conversation_ids
    assert server_process.attributes["nservicebus.message_type"] == f"{__name__}.PlaceOrder"


def _count(span: ReadableSpan) -> int:
    return int(span.attributes.get("messaging.batch.message_count", 0))


#: The trace headers of a .NET sender: NServiceBus 8 to 10.2 write ``traceparent``; 10.3+ also
#: ``NServiceBus.TraceParent``, which wins when a broker SDK overwrote ``traceparent``.
DOTNET_SENDERS = {
    "nservicebus-8": {"traceparent": DOTNET_TRACEPARENT},
    "nservicebus-10.3": {
        "NServiceBus.TraceParent": DOTNET_TRACEPARENT,
        "traceparent": SDK_TRACEPARENT,
    },
}


@pytest.mark.parametrize("sender", list(DOTNET_SENDERS))
def test_a_dotnet_traceparent_header_becomes_the_parent_of_the_handle_span(
    database, telemetry, sender
):
    """A .NET sender's trace headers, literal: the trace goes on through our handler."""
    dotnet = database.transport()  # the .NET sender: no instrumentation of ours at all
    dotnet.create_queue("sales")
    dotnet.create_queue("shipping")
    dotnet.send(
        "sales",
        OutgoingMessage(
            b'{"number": 1}',
            headers={
                "NServiceBus.EnclosedMessageTypes": "Sales.PlaceOrder, Sales, Version=1.0.0.0",
                "NServiceBus.ConversationId": "a3b9bd10-2b6c-4e2a-9d0e-0c7d4fb4b001",
                **DOTNET_SENDERS[sender],
                "tracestate": DOTNET_TRACESTATE,
                "baggage": "tenant=acme",
            },
        ),
    )
    transport = database.transport(instrumentation=telemetry.instrumentation)
    endpoint = Endpoint("sales", transport, settings=settings())

    @endpoint.handle(PlaceOrder, type_name="Sales.PlaceOrder")
    def place(order: PlaceOrder, context: HandlerContext) -> None:
        context.send("shipping", OrderPlaced(number=order.number))

    endpoint.start()
    try:
        wait_for(lambda: len(telemetry.finished("send shipping")) == 1, "the handler's send")
    finally:
        assert endpoint.stop(5)

    [process] = telemetry.finished("process sales")
    assert format(process.context.trace_id, "032x") == DOTNET_TRACE_ID
    assert process.parent is not None and process.parent.is_remote
    assert format(process.parent.span_id, "016x") == DOTNET_SPAN_ID
    assert process.context.trace_state.get("congo") == "t61rcWkgMzE"
    assert process.attributes["messaging.message.conversation_id"] == (
        "a3b9bd10-2b6c-4e2a-9d0e-0c7d4fb4b001"
    )
    # What the handler sent carries the same trace on to the next endpoint (.NET or ours).
    [sent] = dotnet.receive("shipping")
    [send_span] = telemetry.finished("send shipping")
    assert send_span.parent.span_id == process.context.span_id
    assert sent.headers["traceparent"] == (
        f"00-{DOTNET_TRACE_ID}-{format(send_span.context.span_id, '016x')}-01"
    )
    assert sent.headers["NServiceBus.TraceParent"] == sent.headers["traceparent"]
    assert sent.headers["tracestate"] == DOTNET_TRACESTATE
    assert sent.headers["baggage"] == "tenant=acme"


def test_start_new_trace_on_receive_makes_a_root_linked_to_the_sender(database, telemetry):
    """``NServiceBus.OpenTelemetry.StartNewTrace: True`` (StartNewTraceOnReceive in .NET)."""
    dotnet = database.transport()
    dotnet.create_queue("sales")
    dotnet.send(
        "sales",
        OutgoingMessage(
            b'{"number": 2}',
            headers={
                "NServiceBus.EnclosedMessageTypes": "Sales.PlaceOrder",
                "NServiceBus.OpenTelemetry.StartNewTrace": "True",
                "traceparent": DOTNET_TRACEPARENT,
            },
        ),
    )
    transport = database.transport(instrumentation=telemetry.instrumentation)
    endpoint = Endpoint("sales", transport, settings=settings())
    endpoint.handle(PlaceOrder, lambda order, context: None, type_name="Sales.PlaceOrder")
    endpoint.start()
    try:
        wait_for(lambda: len(telemetry.finished("process sales")) == 1, "the handling")
    finally:
        assert endpoint.stop(5)
    [process] = telemetry.finished("process sales")
    assert process.parent is None
    assert format(process.context.trace_id, "032x") != DOTNET_TRACE_ID
    assert [format(link.context.span_id, "016x") for link in process.links] == [DOTNET_SPAN_ID]


def test_metrics_count_fetches_successes_failures_and_times(database, telemetry):
    transport = database.transport(instrumentation=telemetry.instrumentation)
    endpoint = Endpoint(
        "orders", transport, settings=settings(immediate_retries=1, delayed_retries=0)
    )
    endpoint.handle(PlaceOrder, _maybe_fail, type_name="Sales.PlaceOrder")
    transport.create_queue("orders")
    transport.send_many(
        "orders",
        [
            OutgoingMessage(PlaceOrder(number=1)),
            OutgoingMessage(PlaceOrder(number=2)),
            OutgoingMessage(PlaceOrder(number=3, fail=True)),
        ],
    )
    assert transport.peek("orders") == 3  # the depth gauge keeps the last peek
    depth = telemetry.metrics()["sqlqueue.queue.depth"]
    assert [(p.attributes["nservicebus.queue"], p.value) for p in depth] == [("orders", 3)]

    endpoint.start()
    try:
        wait_for(lambda: endpoint.stats.received == 4, "2 handled, 1 retried, 1 moved")
    finally:
        assert endpoint.stop(5)

    queue = {"nservicebus.queue": "orders"}
    assert telemetry.total("nservicebus.messaging.fetches", **queue) == 4
    assert telemetry.total("nservicebus.messaging.successes", **queue) == 2
    # Each failed attempt counts, as in NServiceBus, with the exception's type.
    assert telemetry.total(
        "nservicebus.messaging.failures", **queue, **{"error.type": f"{__name__}.Refused"}
    ) == 2
    assert telemetry.total("nservicebus.recoverability.immediate", **queue) == 1
    assert telemetry.total("nservicebus.recoverability.error", **queue) == 1
    # Times: one point per success, in seconds, tagged with the message type.
    typed = {**queue, "nservicebus.message_type": f"{__name__}.PlaceOrder"}
    assert telemetry.total("nservicebus.messaging.processing_time", **typed) == 2
    assert telemetry.total("nservicebus.messaging.critical_time", **typed) == 2
    assert telemetry.total("nservicebus.messaging.handler_time", **typed) == 4
    [critical] = telemetry.metrics()["nservicebus.messaging.critical_time"]
    assert 0 <= critical.min <= critical.max < 60
    # The failed handling's span says why.
    processed = telemetry.finished("process orders")
    failed = [span for span in processed if span.status.status_code is StatusCode.ERROR]
    assert len(failed) == 2
    assert failed[0].attributes["error.type"] == f"{__name__}.Refused"
    assert [event.name for event in failed[0].events] == ["exception"]


class Refused(Exception):
    pass


def _maybe_fail(order: PlaceOrder, context: HandlerContext) -> None:
    if order.fail:
        raise Refused(f"order {order.number}")


def test_outbox_messages_carry_the_trace_and_the_dispatcher_reports_its_work(database, telemetry):
    transport = database.transport(instrumentation=telemetry.instrumentation)
    transport.create_queue("billing")
    outbox = Outbox(transport)
    outbox.create_table()
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("the user's request") as request:
        with UnitOfWork(transport, mode="outbox", outbox=outbox, dispatch_inline=False) as unit:
            unit.send("billing", OutgoingMessage(b"bill order 1"))
            unit.send("billing", OutgoingMessage(b"bill order 2"))
    stores = telemetry.finished("send billing")
    assert len(stores) == 2
    assert {span.parent.span_id for span in stores} == {request.get_span_context().span_id}

    dispatcher = OutboxDispatcher(outbox, DispatcherSettings(grace_period=0))
    report = dispatcher.dispatch_batch()
    assert report.dispatched == 1  # one record, both messages
    dispatcher.dispatch_batch()  # an idle poll: no span
    [dispatch] = telemetry.finished("dispatch OutboxData")
    assert dispatch.attributes["messaging.batch.message_count"] == 2
    assert dispatch.attributes["sqlqueue.outbox.records"] == 1
    assert telemetry.total("sqlqueue.outbox.dispatched") == 1
    [backlog] = telemetry.metrics()["sqlqueue.outbox.backlog"]
    assert backlog.value == 0

    # Each dispatched message carries the context of the send span that stored it.
    received = Transport(database.engine).receive("billing", 2)
    carried = sorted(message.headers["traceparent"] for message in received)
    expected = sorted(
        f"00-{s.context.trace_id:032x}-{s.context.span_id:016x}-{s.context.trace_flags:02x}"
        for s in stores
    )
    assert carried == expected


def test_set_instrumentation_reaches_transports_made_before_and_none_stops_it(database, telemetry):
    before = database.transport()
    assert before.instrumentation is None
    try:
        instrumentation.set_instrumentation(telemetry.instrumentation)
        after = database.transport()
        assert before.instrumentation is telemetry.instrumentation
        assert after.instrumentation is telemetry.instrumentation
        own = database.transport(instrumentation=instrumentation.NoInstrumentation())
        before.create_queue("q")
        before.send("q", OutgoingMessage(b"traced"))
        [traced] = before.receive("q")
        assert traced.headers["traceparent"].startswith("00-")
    finally:
        instrumentation.set_instrumentation(None)
    assert before.instrumentation is None and after.instrumentation is None
    assert isinstance(own.instrumentation, instrumentation.NoInstrumentation)
    # Off: nothing is added to the message.
    before.send("q", OutgoingMessage(b"plain"))
    [plain] = before.receive("q")
    assert "traceparent" not in plain.headers
    with pytest.raises(Exception, match="does not implement"):
        instrumentation.set_instrumentation(object())  # type: ignore[arg-type]


def test_an_endpoint_of_its_own_instrumentation_traces_handling_only(database, telemetry):
    """Endpoint(instrumentation=...) traces the handlers; the transport's sends stay plain."""
    transport = database.transport()
    transport.create_queue("solo")
    transport.send("solo", OutgoingMessage(PlaceOrder(number=5)))
    handled = threading.Event()
    endpoint = Endpoint(
        "solo", transport, settings=settings(), instrumentation=telemetry.instrumentation
    )
    endpoint.handle(PlaceOrder, lambda order, context: handled.set())
    endpoint.start()
    try:
        wait_for(handled.is_set, "the handling")
        wait_for(lambda: telemetry.total("nservicebus.messaging.successes") == 1, "the count")
    finally:
        assert endpoint.stop(5)
    assert [span.name for span in telemetry.finished()] == ["process solo"]


def test_a_delayed_message_keeps_its_trace_through_the_delayed_table(database, telemetry):
    """send (delayed) -> the mover's ``move`` span -> process, the child of the send span."""
    transport = database.transport(instrumentation=telemetry.instrumentation)
    endpoint = Endpoint("later", transport, settings=settings())
    handled = threading.Event()
    endpoint.handle(PlaceOrder, lambda order, context: handled.set())
    endpoint.start()
    try:
        message_id = transport.send("later", OutgoingMessage(PlaceOrder(number=9)), delay=0.2)
        wait_for(handled.is_set, "the delayed message")
        wait_for(lambda: len(telemetry.finished("process later")) == 1, "its span")
    finally:
        assert endpoint.stop(5)
    [send] = telemetry.finished("send later")
    [move] = telemetry.finished("move later")
    [process] = telemetry.finished("process later")
    assert send.attributes["messaging.message.id"] == message_id
    assert process.parent.span_id == send.context.span_id
    assert move.attributes["messaging.batch.message_count"] == 1
    assert telemetry.total("sqlqueue.delayed.moved", **{"nservicebus.queue": "later"}) == 1


class _Named:
    """A base of the user's own, with a cooperative constructor."""

    def __init__(self, name: str, **rest: Any) -> None:
        super().__init__(**rest)
        self.name = name


class _CountingSends(instrumentation.NoInstrumentation, _Named):
    """Only the send hook of its own; the rest are NoInstrumentation's."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.sends = 0

    def send(self, queue: str, messages: Any, proceed: Any) -> list[str]:
        self.sends += 1
        return proceed(messages)  # type: ignore[no-any-return]


def test_a_partial_instrumentation_built_on_no_instrumentation_keeps_its_other_bases(database):
    """A subclass of NoInstrumentation mixed with a base of its own: the cooperative
    constructor reaches that base, and the hooks it leaves out do nothing but proceed."""
    counting = _CountingSends("audit")
    assert counting.name == "audit"
    transport = database.transport(instrumentation=counting)
    transport.create_queue("partial")
    transport.send("partial", OutgoingMessage(b"one"))
    [message] = transport.receive("partial")
    assert message.body == b"one" and "traceparent" not in message.headers
    assert counting.sends == 1
