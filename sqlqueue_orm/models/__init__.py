"""Declarative models: the queue table factory and the shared tables (outbox, rate limits, ...).

Queue tables are created at run time with names only the user knows, so they live in their own
:class:`~sqlalchemy.MetaData` (``QUEUE_METADATA``), never in :data:`Base.metadata`, which holds
only the shared tables Alembic manages with autogenerate. Contrib's tables (the Spark send
ledger) live in contrib and join the same metadata when their module is imported.

The names below are imported on first use, every model module at once (so that
:data:`Base.metadata` then holds every shared table): a program that needs only a queue's Core
table (:mod:`~sqlqueue_orm.models.queue_table`, as the transport does) imports its module
alone and never loads SQLAlchemy's ORM.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlqueue_orm.models.base import NAMING_CONVENTION as NAMING_CONVENTION
    from sqlqueue_orm.models.base import Base as Base
    from sqlqueue_orm.models.endpoint_control import ControlAction as ControlAction
    from sqlqueue_orm.models.endpoint_control import EndpointControl as EndpointControl
    from sqlqueue_orm.models.endpoint_health import EndpointHeartbeat as EndpointHeartbeat
    from sqlqueue_orm.models.endpoint_health import QueueMetricSample as QueueMetricSample
    from sqlqueue_orm.models.failure_group import FailureGroupEntry as FailureGroupEntry
    from sqlqueue_orm.models.outbox import OutboxData as OutboxData
    from sqlqueue_orm.models.outbox_delivery import OutboxDelivery as OutboxDelivery
    from sqlqueue_orm.models.queue_table import QUEUE_METADATA as QUEUE_METADATA
    from sqlqueue_orm.models.queue_table import QueueMessage as QueueMessage
    from sqlqueue_orm.models.queue_table import build_queue_table as build_queue_table
    from sqlqueue_orm.models.queue_table import queue_model as queue_model
    from sqlqueue_orm.models.rate_limit import RateLimitSchedule as RateLimitSchedule

#: The package's names, by the module (below this package) that defines them.
_NAMES = {
    "base": ("NAMING_CONVENTION", "Base"),
    "endpoint_control": ("ControlAction", "EndpointControl"),
    "endpoint_health": ("EndpointHeartbeat", "QueueMetricSample"),
    "failure_group": ("FailureGroupEntry",),
    "outbox": ("OutboxData",),
    "outbox_delivery": ("OutboxDelivery",),
    "queue_table": ("QUEUE_METADATA", "QueueMessage", "build_queue_table", "queue_model"),
    "rate_limit": ("RateLimitSchedule",),
}


def __getattr__(name: str) -> Any:
    """Import every model module when one of the package's names is first used, and keep them.

    Any other name (a submodule not imported yet among them) is no attribute, so that
    ``from sqlqueue_orm.models import queue_table`` imports that module alone.
    """
    if not any(name in names for names in _NAMES.values()):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module, names in _NAMES.items():
        loaded = importlib.import_module(f"{__name__}.{module}")
        globals().update({each: getattr(loaded, each) for each in names})
    return globals()[name]
