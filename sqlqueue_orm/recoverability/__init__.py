"""Recoverability tools: read, retry and delete what landed in an error queue.

:mod:`~sqlqueue_orm.recoverability.error_queue` is the one API the ``sqlqueue errors`` commands
and the dashboard use, with :mod:`~sqlqueue_orm.recoverability.groups` (failure groups) and
:mod:`~sqlqueue_orm.recoverability.search` (filters and paging); moving messages there is the
receiving side's work (:mod:`sqlqueue_orm.receiving.forwarding`).
"""

from __future__ import annotations

from sqlqueue_orm.recoverability.error_queue import ErrorQueue, FailedMessage
from sqlqueue_orm.recoverability.groups import FailureGroup, FailureGroups
from sqlqueue_orm.recoverability.search import ErrorFilter, ErrorSearch, Page

__all__ = [
    "ErrorFilter",
    "ErrorQueue",
    "ErrorSearch",
    "FailedMessage",
    "FailureGroup",
    "FailureGroups",
    "Page",
]
