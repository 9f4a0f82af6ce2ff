"""Small helpers shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterable

from sqlqueue_orm import IncomingMessage


def bodies(messages: Iterable[IncomingMessage]) -> list[bytes | None]:
    """The bodies of *messages*, in order."""
    return [message.body for message in messages]
