"""Declarative models: the queue table factory and the shared tables (outbox, rate limits, ...).

Queue tables are created at run time with names only the user knows, so they live in their own
:class:`~sqlalchemy.MetaData` (``QUEUE_METADATA``), never in :data:`Base.metadata`, which holds
only the shared tables Alembic manages with autogenerate. Contrib's tables (the Spark send
ledger) live in contrib and join the same metadata when their module is imported.
"""

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
