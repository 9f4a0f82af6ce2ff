"""Synthetic NServiceBus audit and error messages, for demos and tests (no Spark needed).

Real .NET endpoints write these to their audit and error queues; until an endpoint of ours does,
:func:`fill_sample_queues` puts realistic ones there: a small order system (ClientUI sends
PlaceOrder to Sales, which publishes OrderPlaced to Billing and Shipping, Billing publishes
OrderBilled to Shipping), with load that rises and falls, processing times that grow with it,
and a few failures with their ``NServiceBus.ExceptionInfo.*`` headers. Seeded, so the same
arguments give the same messages.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import random
import uuid
from collections.abc import Iterator

from sqlqueue_orm import headers
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.transport import Transport

_ASSEMBLY = ", Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"


@dataclasses.dataclass(frozen=True)
class _Route:
    # Alike verify.Drift only in shape: a frozen record of names.
    message_type: str
    assembly: str
    intent: str
    sender: str
    receiver: str
    #: median processing time in milliseconds at low load
    median_ms: float
    share: float


ROUTES = (
    _Route("Sales.Messages.Commands.PlaceOrder", "Sales.Messages", "Send", "ClientUI", "Sales",
           18.0, 0.34),
    _Route("Sales.Messages.Events.OrderPlaced", "Sales.Messages", "Publish", "Sales", "Billing",
           55.0, 0.22),
    _Route("Sales.Messages.Events.OrderPlaced", "Sales.Messages", "Publish", "Sales", "Shipping",
           9.0, 0.22),
    _Route("Billing.Messages.Events.OrderBilled", "Billing.Messages", "Publish", "Billing",
           "Shipping", 14.0, 0.22),
)

EXCEPTIONS = (
    ("System.TimeoutException", "The operation has timed out while calling the payment gateway."),
    ("Microsoft.Data.SqlClient.SqlException",
     "Transaction (Process ID 74) was deadlocked on lock resources with another process."),
    ("System.InvalidOperationException", "Order is already billed."),
)


def _load(fraction: float) -> float:
    """Relative load over the window: a morning ramp, a lunch peak, a quiet dip."""
    return (
        0.55
        + 0.35 * math.sin(math.pi * fraction)
        + 0.45 * math.exp(-(((fraction - 0.62) / 0.06) ** 2))
        - 0.25 * math.exp(-(((fraction - 0.3) / 0.05) ** 2))
    )


def sample_messages(
    count: int,
    *,
    failure_rate: float = 0.02,
    start: dt.datetime | None = None,
    span: dt.timedelta = dt.timedelta(hours=1),
    seed: int = 1,
) -> Iterator[tuple[bool, OutgoingMessage]]:
    """Yield (failed, message) pairs in time order over *span* from *start*.

    That is *count* audit messages and about ``count * failure_rate`` error messages.

    :param count: processed (audit) messages.
    :param failure_rate: failed messages per processed message.
    :param start: the window's start (naive means UTC).
    :param span: the window's length.
    :param seed: the random seed.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count {count!r} must be a whole number >= 0")
    if not 0 <= failure_rate <= 1:
        raise ValueError(f"failure_rate {failure_rate!r} must be between 0 and 1")
    rng = random.Random(seed)  # noqa: S311  (synthetic data, reproducible by seed)
    if start is None:
        start = dt.datetime.now(dt.UTC).replace(microsecond=0) - span
    elif start.tzinfo is None:
        start = start.replace(tzinfo=dt.UTC)
    total = count + round(count * failure_rate)
    # Times of sending, drawn by rejection from the load curve, then sorted.
    fractions: list[float] = []
    while len(fractions) < total:
        fraction = rng.random()
        if rng.random() * 1.4 <= _load(fraction):
            fractions.append(fraction)
    fractions.sort()
    failed_positions = set(rng.sample(range(total), total - count))
    weights = [route.share for route in ROUTES]
    for position, fraction in enumerate(fractions):
        route = rng.choices(ROUTES, weights)[0]
        load = _load(fraction)
        sent = start + span * fraction
        wait_ms = rng.expovariate(1 / (5 + 120 * load**4))
        work_ms = route.median_ms * (0.6 + load**2) * math.exp(rng.gauss(0, 0.45))
        started = sent + dt.timedelta(milliseconds=wait_ms)
        ended = started + dt.timedelta(milliseconds=work_ms)
        message_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        conversation = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        values = {
            headers.MESSAGE_ID: message_id,
            headers.CORRELATION_ID: message_id,
            headers.CONVERSATION_ID: conversation,
            headers.MESSAGE_INTENT: route.intent,
            headers.CONTENT_TYPE: "application/json",
            headers.ENCLOSED_MESSAGE_TYPES: f"{route.message_type}, {route.assembly}{_ASSEMBLY}",
            headers.ORIGINATING_ENDPOINT: route.sender,
            headers.ORIGINATING_MACHINE: f"{route.sender.lower()}-01",
            headers.REPLY_TO_ADDRESS: route.sender,
            headers.TIME_SENT: headers.format_time(sent),
            "NServiceBus.Version": "9.2.3",
            headers.PROCESSING_ENDPOINT: route.receiver,
            headers.PROCESSING_MACHINE: f"{route.receiver.lower()}-0{1 + position % 2}",
        }
        body = json.dumps({"OrderId": f"order-{position + 1:07d}",
                           "Amount": round(rng.uniform(5, 500), 2)})
        failed = position in failed_positions
        if failed:
            exception_type, text = rng.choice(EXCEPTIONS)
            values.update(
                {
                    headers.FAILED_QUEUE: route.receiver,
                    headers.TIME_OF_FAILURE: headers.format_time(ended),
                    headers.EXCEPTION_TYPE: exception_type,
                    headers.EXCEPTION_MESSAGE: text,
                    "NServiceBus.ExceptionInfo.Source": route.receiver,
                    "NServiceBus.ExceptionInfo.StackTrace": f"{exception_type}: {text}\n"
                    f"   at {route.receiver}.Handler.Handle({route.message_type.rsplit('.', 1)[1]}"
                    " message, IMessageHandlerContext context)",
                }
            )
        else:
            values[headers.PROCESSING_STARTED] = headers.format_time(started)
            values[headers.PROCESSING_ENDED] = headers.format_time(ended)
        yield failed, OutgoingMessage(body=body, headers=values, message_id=message_id)


def fill_sample_queues(
    transport: Transport,
    *,
    audit_queue: str = "audit",
    error_queue: str = "error",
    count: int = 10_000,
    failure_rate: float = 0.02,
    start: dt.datetime | None = None,
    span: dt.timedelta = dt.timedelta(hours=1),
    seed: int = 1,
    batch_size: int = 1_000,
) -> tuple[list[OutgoingMessage], list[OutgoingMessage]]:
    """Create the audit and error queues if needed and fill them with :func:`sample_messages`.

    Returns the (audit, error) messages sent, in sending order.

    :param transport: where to send.
    :param audit_queue: the audit queue.
    :param error_queue: the error queue.
    :param count: processed (audit) messages.
    :param failure_rate: failed (error) messages per processed message.
    :param start: the window's start (naive means UTC; default: *span* before now).
    :param span: the window's length.
    :param seed: the random seed.
    :param batch_size: messages per send transaction.
    """
    transport.create_queue(audit_queue)
    transport.create_queue(error_queue)
    audit: list[OutgoingMessage] = []
    error: list[OutgoingMessage] = []
    pending: dict[bool, list[OutgoingMessage]] = {False: [], True: []}
    for failed, message in sample_messages(
        count, failure_rate=failure_rate, start=start, span=span, seed=seed
    ):
        (error if failed else audit).append(message)
        pending[failed].append(message)
        if len(pending[failed]) >= batch_size:
            transport.send_many(error_queue if failed else audit_queue, pending[failed])
            pending[failed] = []
    for failed, messages in pending.items():
        if messages:
            transport.send_many(error_queue if failed else audit_queue, messages)
    return audit, error
