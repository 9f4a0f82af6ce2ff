"""Limits within one process, where the database has no locks to share (SQLite).

Shared by every endpoint of the process on the same database file and queue.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

#: Guards the two registries below, and each queue's counts of messages in flight per key.
lock = threading.Lock()
_semaphores: dict[tuple[str, str], tuple[int, threading.BoundedSemaphore]] = {}
_key_counts: dict[tuple[str, str], dict[str, int]] = {}


def semaphore(engine: Engine, name: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of the queue *name* in *engine*'s database.

    :raises ConfigurationError: another endpoint of this process set another limit on it.
    """
    key = (engine.url.render_as_string(hide_password=True), name)
    with lock:
        found = _semaphores.get(key)
        if found is None:
            found = _semaphores[key] = (limit, threading.BoundedSemaphore(limit))
        elif found[0] != limit:
            raise exceptions.ConfigurationError(
                f"queue {name}: global_concurrency {limit} differs from the {found[0]} another "
                "endpoint of this process set on the same queue"
            )
        return found[1]


def key_counts(engine: Engine, name: str) -> dict[str, int]:
    """The process-wide messages in flight per key of *name* in *engine*'s database.

    Read and changed under :data:`lock`.
    """
    key = (engine.url.render_as_string(hide_password=True), name)
    with lock:
        return _key_counts.setdefault(key, {})
