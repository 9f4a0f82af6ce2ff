"""Failures per message, in memory (NServiceBus's ``FailureInfoStorage``), bounded.

The immediate retries count here (a restart starts over); the delayed retries count in the
message's own ``NServiceBus.Retries`` header (:mod:`sqlqueue_orm.receiving.retries`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlqueue_orm.messages import IncomingMessage

#: Messages whose failures are remembered at most (the oldest are forgotten first).
MAX_REMEMBERED_FAILURES = 10_000


class FailureCounts:
    """Failures per message (by native id), the oldest forgotten past *limit* messages."""

    def __init__(self, limit: int = MAX_REMEMBERED_FAILURES) -> None:
        self._counts: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def record(self, key: str) -> int:
        """Count one more failure of *key*; return how many it has had."""
        with self._lock:
            count = self._counts.pop(key, 0) + 1
            self._counts[key] = count
            while len(self._counts) > self._limit:
                self._counts.popitem(last=False)
            return count

    def forget(self, key: str) -> None:
        """Drop what is known of *key* (it succeeded or left the queue)."""
        with self._lock:
            self._counts.pop(key, None)

    @property
    def size(self) -> int:
        """How many messages' failures are remembered."""
        return len(self._counts)

    def remembered(self, messages: Iterable[IncomingMessage]) -> list[str]:
        """The keys of those of *messages* whose failures are remembered; cheap when none are."""
        if not self._counts:  # nothing remembered: no lock, no ids to format
            return []
        with self._lock:
            return [key for message in messages if (key := str(message.id)) in self._counts]

    def forget_many(self, keys: list[str]) -> None:
        """Drop what is known of each of *keys* (a batch committed)."""
        if not keys:
            return
        with self._lock:
            for key in keys:
                self._counts.pop(key, None)
