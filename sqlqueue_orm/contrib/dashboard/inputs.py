"""What every page does with what it is given: query times, actions, library errors, the client.

Shared by the pages of :mod:`.app`, :mod:`.groups` and :mod:`.control`, so a bad value reads the
same, a confirmation's button names its action alike, a read-only dashboard refuses a retry or
delete in the same words, a library error gets the same HTTP status, and a change is logged with
the client's address alike on each.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    from starlette.requests import Request


#: Why a read-only dashboard refuses a retry or delete of error messages (the errors page and
#: the failure groups page alike).
READ_ONLY = (
    "the dashboard is read-only: start it with --allow-changes "
    "(create_app(..., allow_changes=True)) to retry or delete"
)
#: The word on the confirm button of each change a confirmation page asks about.
VERBS = {
    "retry": "Retry",
    "delete": "Delete",
    "retry_all": "Retry all",
    "pause": "Pause",
    "resume": "Resume",
    "concurrency": "Set concurrency",
}


class BadInput(Exception):
    """A query or form value the page cannot use; the message names it."""


def utc_time(name: str, text: str | None) -> dt.datetime | None:
    """The query value *text* of *name* as an aware time (UTC when it names no zone), or None."""
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadInput(f"{name} {text!r} is not a date and time (YYYY-MM-DDTHH:MM)") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def unknown_action(action: str, taken: Sequence[str]) -> str:
    """Why *action* is refused by a page that takes the actions *taken*, naming them all."""
    named = f"{', '.join(taken[:-1])} or {taken[-1]}" if len(taken) > 1 else taken[0]
    return f"action {action!r} must be {named}"


def missing(error: exceptions.SqlQueueError) -> bool:
    """Whether *error* says the queue asked for does not exist."""
    return isinstance(error, exceptions.QueueNotFound)


def status(error: exceptions.SqlQueueError) -> int:
    """404: no such queue; 500: a table to migrate (waiting will not help); 503: anything else."""
    if missing(error):
        return 404
    return 500 if isinstance(error, exceptions.SchemaOutdated) else 503


def client(request: Request) -> str:
    """``host:port`` of the request's client, as the log lines of changes name it."""
    found = request.client
    return f"{found.host}:{found.port}" if found else "an unknown client"
