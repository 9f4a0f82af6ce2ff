"""Small helpers shared by the integration tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from sqlqueue_orm import IncomingMessage


def bodies(messages: Iterable[IncomingMessage]) -> list[bytes | None]:
    """The bodies of *messages*, in order."""
    return [message.body for message in messages]


def waited(condition: Callable[[], object], timeout: float) -> bool:
    """Whether *condition* came true within *timeout* seconds (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def wait_until(condition: Callable[[], object], what: str, timeout: float) -> None:
    """Wait for *condition*; fail naming *what* when *timeout* seconds pass first."""
    if not waited(condition, timeout):
        raise AssertionError(f"timed out waiting for {what}")
