"""sqlqueue_orm: durable message queues in SQL Server, PostgreSQL and SQLite tables.

Queue tables have the NServiceBus SQL Server transport's layout and header format, so Python
and .NET endpoints can share them. Sends join your transaction; receives skip rows other
receivers hold; an outbox and a dispatcher carry messages to other databases; an
:class:`Endpoint` pumps its input queue into handlers, in one of five transaction modes.
"""

from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.exceptions import (
    ConfigurationError,
    DatabaseError,
    DuplicateMessage,
    QueueNotFound,
    SqlQueueError,
)
from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_model, queue_table
from sqlqueue_orm.receiving.endpoint import Endpoint, HandlerContext
from sqlqueue_orm.receiving.settings import EndpointSettings, TransactionMode
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.routing import Routing
from sqlqueue_orm.session import UnitOfWork, unit_of_work
from sqlqueue_orm.transport import Transport

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "DatabaseError",
    "DuplicateMessage",
    "Endpoint",
    "EndpointSettings",
    "HandlerContext",
    "IncomingMessage",
    "Outbox",
    "OutboxDispatcher",
    "OutgoingMessage",
    "QueueAddress",
    "QueueNotFound",
    "Routing",
    "SqlQueueError",
    "TransactionMode",
    "Transport",
    "UnitOfWork",
    "__version__",
    "queue_model",
    "queue_table",
    "unit_of_work",
]
