"""What the dashboard reads and changes, each through the library's public API.

* queues: :meth:`Transport.list_queues` (depths from peek) and :meth:`Transport.browse`;
* the error queue: :class:`sqlqueue_orm.recoverability.error_queue.ErrorQueue` (``list``,
  ``get``, ``retry``, ``retry_all``, ``delete``, ``count``);
* the outbox: :meth:`sqlqueue_orm.sending.outbox.Outbox.backlog`;
* delayed messages: shown once the library has a delayed-delivery API to list them with.

The error queue module is imported when first needed, so a library without it still serves the
other pages (the error page then says what is missing).
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from sqlqueue_orm.sending.outbox import Outbox, OutboxBacklog
from sqlqueue_orm.transport import Transport

#: The module of the error queue API.
ERROR_QUEUE_MODULE = "sqlqueue_orm.recoverability.error_queue"


class FailedMessageView(Protocol):
    """What the pages show of one message of the error queue (``FailedMessage``)."""

    @property
    def id(self) -> str: ...  # noqa: D102
    @property
    def message_id(self) -> str: ...  # noqa: D102
    @property
    def failed_queue(self) -> str | None: ...  # noqa: D102
    @property
    def exception_type(self) -> str | None: ...  # noqa: D102
    @property
    def exception_message(self) -> str | None: ...  # noqa: D102
    @property
    def time_of_failure(self) -> dt.datetime | None: ...  # noqa: D102
    @property
    def processing_endpoint(self) -> str | None: ...  # noqa: D102
    @property
    def headers(self) -> dict[str, str | None]: ...  # noqa: D102
    @property
    def raw_headers(self) -> str | bytes: ...  # noqa: D102
    @property
    def body(self) -> bytes: ...  # noqa: D102


class ErrorQueueApi(Protocol):
    """The calls of ``ErrorQueue`` the dashboard makes."""

    def list(  # noqa: D102
        self,
        *,
        limit: int = 100,
        exception_type: str | None = None,
        endpoint: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> Sequence[FailedMessageView]: ...
    def get(self, id: str) -> FailedMessageView | None: ...  # noqa: D102
    def retry(self, ids: Iterable[str]) -> int: ...  # noqa: D102
    def retry_all(self, failed_queue: str | None = None) -> int: ...  # noqa: D102
    def delete(self, ids: Iterable[str]) -> int: ...  # noqa: D102
    def count(self) -> int: ...  # noqa: D102


class ErrorQueueMissing(Exception):
    """The installed sqlqueue_orm has no error queue API."""


def error_queue(transport: Transport, name: str) -> ErrorQueueApi:
    """The library's ``ErrorQueue`` of queue *name*.

    :raises ErrorQueueMissing: the library has no ``recoverability.error_queue`` module.
    """
    try:
        module: Any = importlib.import_module(ERROR_QUEUE_MODULE)
    except ModuleNotFoundError as error:
        raise ErrorQueueMissing(
            f"this version of sqlqueue_orm has no {ERROR_QUEUE_MODULE} ({error})"
        ) from error
    api: ErrorQueueApi = module.ErrorQueue(transport, name)
    return api


def outbox_backlog(transport: Transport) -> OutboxBacklog:
    """The outbox backlog of the transport's database (``SchemaOutdated``: no outbox table)."""
    return Outbox(transport).backlog()
