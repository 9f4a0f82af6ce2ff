"""Receiving: endpoints that pump messages off their input queue into handlers.

* ``endpoint``: :class:`Endpoint` (handlers per message type, start/stop/run) and the
  :class:`HandlerContext` handlers get;
* ``pump``: the peek/receive loop, its worker threads and circuit breakers;
* ``strategies``: one receive strategy per :class:`TransactionMode`;
* ``settings``: :class:`EndpointSettings`, validated when built.
"""

from sqlqueue_orm.receiving.endpoint import Endpoint, HandlerContext
from sqlqueue_orm.receiving.settings import EndpointSettings, TransactionMode

__all__ = ["Endpoint", "EndpointSettings", "HandlerContext", "TransactionMode"]
