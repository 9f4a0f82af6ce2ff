"""Receiving: endpoints that pump messages off their input queue into handlers.

* ``endpoint``: :class:`Endpoint` (handlers per message type, start/stop/run);
* ``handling``: the handlers' registry and the :class:`HandlerContext` handlers get;
* ``pump``: the peek/receive loop, its worker threads and circuit breakers;
* ``worker``: what each worker thread carries from one receive to the next;
* ``modes``: one module per :class:`TransactionMode`, batching, and what they share;
* ``flow``: how the workers take messages (the plain receive, the concurrency limits and the
  rate limit), chosen once at start-up;
* ``retries``, ``failure_counts``, ``forwarding``: recoverability's decision, the failures
  remembered per message, and the rows sent to the error and audit queues;
* ``mover``: matured delayed messages into the input queue;
* ``settings``: :class:`EndpointSettings`, validated when built.
"""

from sqlqueue_orm.receiving.endpoint import Endpoint
from sqlqueue_orm.receiving.handling import HandlerContext
from sqlqueue_orm.receiving.settings import EndpointSettings, TransactionMode

__all__ = ["Endpoint", "EndpointSettings", "HandlerContext", "TransactionMode"]
