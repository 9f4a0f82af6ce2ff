"""sqlqueue_orm: durable message queues in SQL Server, PostgreSQL and SQLite tables.

Queue tables have the NServiceBus SQL Server transport's layout and header format, so Python
and .NET endpoints can share them. Sends join your transaction; receives skip rows other
receivers hold; an outbox and a dispatcher carry messages to other databases; an
:class:`Endpoint` pumps its input queue into handlers, in one of five transaction modes.

The names below are what most programs need. The rest is imported from its own module: the
outbox, its dispatcher and routing from :mod:`sqlqueue_orm.sending`, the ``@unit_of_work``
decorator from :mod:`sqlqueue_orm.session`, the Core table of a queue from
:mod:`sqlqueue_orm.models.queue_table`, every exception from :mod:`sqlqueue_orm.exceptions`.

Each name is imported from its module on first use, not with the package: a program that
imports one module of the package (the ``sqlqueue`` command line, which imports SQLAlchemy only
for the commands that reach a database) does not pay for all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlqueue_orm.addressing import QueueAddress
    from sqlqueue_orm.exceptions import (
        ConfigurationError,
        DatabaseError,
        DuplicateMessage,
        QueueNotFound,
        SqlQueueError,
    )
    from sqlqueue_orm.messages import IncomingMessage, OutgoingMessage
    from sqlqueue_orm.models.queue_table import queue_model
    from sqlqueue_orm.receiving.endpoint import Endpoint, HandlerContext
    from sqlqueue_orm.receiving.settings import EndpointSettings, TransactionMode
    from sqlqueue_orm.session import UnitOfWork
    from sqlqueue_orm.transport import Transport

__version__ = "0.1.0"

#: Each public name and the module it is imported from on first use.
_MODULES = {
    "ConfigurationError": "sqlqueue_orm.exceptions",
    "DatabaseError": "sqlqueue_orm.exceptions",
    "DuplicateMessage": "sqlqueue_orm.exceptions",
    "Endpoint": "sqlqueue_orm.receiving.endpoint",
    "EndpointSettings": "sqlqueue_orm.receiving.settings",
    "HandlerContext": "sqlqueue_orm.receiving.endpoint",
    "IncomingMessage": "sqlqueue_orm.messages",
    "OutgoingMessage": "sqlqueue_orm.messages",
    "QueueAddress": "sqlqueue_orm.addressing",
    "QueueNotFound": "sqlqueue_orm.exceptions",
    "SqlQueueError": "sqlqueue_orm.exceptions",
    "TransactionMode": "sqlqueue_orm.receiving.settings",
    "Transport": "sqlqueue_orm.transport",
    "UnitOfWork": "sqlqueue_orm.session",
    "queue_model": "sqlqueue_orm.models.queue_table",
}


def alembic_filter(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic ``include_object`` hook that leaves sqlqueue_orm's tables out of autogenerate.

    Put it in your application's ``env.py``, in each ``context.configure(...)`` call::

        context.configure(..., target_metadata=target_metadata,
                          include_object=sqlqueue_orm.alembic_filter)

    ``alembic check`` and ``alembic revision --autogenerate`` then never propose dropping (or
    creating) a table of the library: its shared tables by name, and its queue, delayed and
    subscription tables by their columns whatever their names, queues created at run time
    included. Your own tables are compared as before. Returns ``False`` for a table of ours,
    ``True`` for anything else (see :mod:`sqlqueue_orm.migration.ownership`).
    """
    # Imported here so that importing the package does not import Alembic.
    from sqlqueue_orm.migration import ownership

    return ownership.include_object(obj, name, type_, reflected, compare_to)


def __getattr__(name: str) -> Any:
    """Import a public name from its module when it is first used, and keep it."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names with the public ones not imported yet."""
    return sorted({*globals(), *_MODULES})


__all__ = [
    "ConfigurationError",
    "DatabaseError",
    "DuplicateMessage",
    "Endpoint",
    "EndpointSettings",
    "HandlerContext",
    "IncomingMessage",
    "OutgoingMessage",
    "QueueAddress",
    "QueueNotFound",
    "SqlQueueError",
    "TransactionMode",
    "Transport",
    "UnitOfWork",
    "__version__",
    "alembic_filter",
    "queue_model",
]
