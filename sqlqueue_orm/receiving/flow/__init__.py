"""Flow control shared by every process on a queue: concurrency limits and the rate limit.

The endpoint's settings choose, once at start-up (:func:`receiver_for`), how its workers take
messages: a :class:`~sqlqueue_orm.receiving.modes.base.Receiver` its transaction mode calls on
every receive (the plain receive is the base class). The limits are receivers, each in its own
module:

* :mod:`~sqlqueue_orm.receiving.flow.global_limit`: ``global_concurrency``, at most K messages
  of the queue in flight across processes;
* :mod:`~sqlqueue_orm.receiving.flow.key_limit`: ``key_header`` and ``key_concurrency``, at most
  K messages of one key in flight (the global slot taken with the key slots);
* :mod:`~sqlqueue_orm.receiving.flow.rate_limit`: ``rate_limit``, at most N messages per
  interval, wrapping any of the others.

What they share: :mod:`~sqlqueue_orm.receiving.flow.slots` (the locks and their claims),
:mod:`~sqlqueue_orm.receiving.flow.leases` (key slots kept between batches) and
:mod:`~sqlqueue_orm.receiving.flow.local` (the limits of one process, SQLite). Their statements
are each dialect's :class:`~sqlqueue_orm.dialects.flow.FlowStatements`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm.receiving.flow.global_limit import GlobalConcurrency
from sqlqueue_orm.receiving.flow.key_limit import KeyConcurrency
from sqlqueue_orm.receiving.flow.rate_limit import RateLimit, RateLimited
from sqlqueue_orm.receiving.modes.base import Receiver

if TYPE_CHECKING:
    from sqlqueue_orm import addressing
    from sqlqueue_orm.receiving.settings import EndpointSettings
    from sqlqueue_orm.transport import Transport

__all__ = ["GlobalConcurrency", "KeyConcurrency", "RateLimit", "RateLimited", "receiver_for"]


def receiver_for(
    transport: Transport, queue: str | addressing.QueueAddress, settings: EndpointSettings
) -> Receiver:
    """The receiver *settings* ask for on *queue*: plain, or under its limits."""
    gate = (
        None
        if settings.global_concurrency is None
        else GlobalConcurrency(transport, queue, settings.global_concurrency)
    )
    receiver: Receiver
    if settings.key_header is not None:
        receiver = KeyConcurrency(
            transport,
            queue,
            settings.key_header,
            settings.key_concurrency,
            settings.key_fifo,
            settings.key_window,
            gate,
            batched=settings.batch_size > 1,
        )
    elif gate is not None:
        receiver = gate
    else:
        receiver = Receiver(transport, queue)
    if settings.rate_limit is not None:
        rate = RateLimit(
            transport.engine,
            transport.address_text(queue),
            settings.rate_limit,
            settings.rate_interval,
            settings.rate_burst or max(1, -(-settings.rate_limit // 10)),
        )
        receiver = RateLimited(receiver, rate, settings.batch_size)
    return receiver
