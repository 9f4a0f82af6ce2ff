"""Recoverability tools: read, retry and delete what landed in an error queue.

:mod:`~sqlqueue_orm.recoverability.error_queue` is the one API the ``sqlqueue errors`` commands
and the dashboard use; moving messages there is the receiving side's work
(:mod:`sqlqueue_orm.receiving.forwarding`).
"""

from __future__ import annotations

from sqlqueue_orm.recoverability.error_queue import ErrorQueue, FailedMessage

__all__ = ["ErrorQueue", "FailedMessage"]
