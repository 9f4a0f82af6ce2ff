"""The dashboard's failure groups and error-queue search.

* ``/errors/groups?by=type|endpoint|message-type``: the failure groups, largest first
  (:class:`~sqlqueue_orm.recoverability.groups.FailureGroups`), each linked to its messages on
  the errors page and, with ``allow_changes``, to a retry or delete of the whole group;
* ``/errors/groups/confirm?action=retry|delete&group=ID``: asks first, naming the group and how
  many messages it has; its form POSTs to ``/errors/groups/retry`` or ``/errors/groups/delete``,
  checked as every changing POST is (CSRF token and Origin, :mod:`.security`); the group's
  messages as they are then are retried or deleted, each once;
* ``/errors/matching?action=retry|delete&<filters>``: "all that match" the errors page's
  filters: a confirmation page listing every match (at most ``MAX_CHOSEN``; more is refused),
  whose form POSTs exactly those ids to the errors page's own ``/errors/retry`` or
  ``/errors/delete``.

:func:`search_filter` reads the errors page's filters (message id, ``name=value`` header, body
text, group, exception type, endpoint, time of failure) and its page cursor from the query.
"""

from __future__ import annotations

import datetime as dt
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from sqlqueue_orm import exceptions
from sqlqueue_orm.contrib.dashboard import inputs
from sqlqueue_orm.recoverability.groups import GROUPINGS, FailureGroups
from sqlqueue_orm.recoverability.search import (
    ErrorFilter,
    ErrorSearch,
    Page,
    parse_cursor,
    parse_header,
)

__all__ = ["ErrorSearch", "GroupPages", "Page", "search_filter"]

log = logging.getLogger("sqlqueue_orm.contrib.dashboard")

T = TypeVar("T")

#: The changes of a group's and of "all that match"'s confirmation pages.
_ACTIONS = ("retry", "delete")
#: Query parameters of the search filters, as the errors page names them.
FILTER_PARAMS = ("message_id", "header", "text", "group", "exception_type", "endpoint")


class Pages(Protocol):
    """What these pages use of the dashboard's request handlers."""

    dashboard: Any

    def render(
        self, request: Request, template: str, status: int = 200, **values: Any
    ) -> HTMLResponse:
        """Render a page."""

    def problem(self, request: Request, status: int, text: str) -> HTMLResponse:
        """A page that says what went wrong."""

    def confirmation(
        self, request: Request, template: str, action: str, **values: Any
    ) -> HTMLResponse:
        """The page asking before *action*, with the verb of its button."""

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking code on the thread pool."""

    async def checked_form(self, request: Request) -> tuple[list[str], Response | None]:
        """The ids of a changing POST, or the response refusing it."""


def search_filter(
    params: Mapping[str, str], since: dt.datetime | None, until: dt.datetime | None
) -> tuple[ErrorFilter, str | None]:
    """The filter and the page cursor of the errors page's query.

    :raises ConfigurationError: a header that is not ``name=value``, a cursor that is not one.
    """
    header = params.get("header") or None
    after = params.get("after") or None
    parse_cursor(after)
    wanted = ErrorFilter(
        message_id=(params.get("message_id") or "").strip() or None,
        header=None if header is None else parse_header(header),
        text=params.get("text") or None,
        group=(params.get("group") or "").strip() or None,
        exception_type=params.get("exception_type") or None,
        endpoint=params.get("endpoint") or None,
        since=since,
        until=until,
    )
    return wanted, after


class GroupPages:
    """The request handlers of the groups pages and of "all that match".

    :param pages: the dashboard's handlers (rendering, the thread pool, the POST checks).
    :param most: most messages one "all that match" takes.
    """

    def __init__(self, pages: Pages, most: int) -> None:
        self.pages = pages
        self.most = most

    def _groups(self) -> FailureGroups:
        return FailureGroups(self.pages.dashboard.error_queue())

    async def groups(self, request: Request) -> Response:
        """The failure groups of one grouping, largest first."""
        by = request.query_params.get("by") or "type"
        if by not in GROUPINGS:
            return self.pages.problem(
                request, 400, f"grouping {by!r} must be one of: {', '.join(GROUPINGS)}"
            )
        try:
            found = await self.pages.call(lambda: self._groups().list(by))
        except exceptions.SqlQueueError as error:
            return self.pages.problem(request, inputs.status(error), str(error))
        return self.pages.render(
            request, "groups.html", groups=found, by=by, groupings=list(GROUPINGS)
        )

    def _action(self, request: Request) -> str | Response:
        """The retry or delete a confirmation page asks about, or the page refusing it."""
        if not self.pages.dashboard.allow_changes:
            return self.pages.problem(request, 403, inputs.READ_ONLY)
        action = request.query_params.get("action", "")
        if action not in _ACTIONS:
            return self.pages.problem(request, 400, inputs.unknown_action(action, _ACTIONS))
        return action

    async def confirm(self, request: Request) -> Response:
        """Ask before a group's retry or delete."""
        action = self._action(request)
        if isinstance(action, Response):
            return action
        wanted = request.query_params.get("group", "")
        try:
            group = await self.pages.call(lambda: self._groups().get(wanted))
        except exceptions.ConfigurationError as error:
            return self.pages.problem(request, 404, str(error))
        except exceptions.SqlQueueError as error:
            return self.pages.problem(request, inputs.status(error), str(error))
        return self.pages.confirmation(
            request, "group_confirm.html", action, group=group, target=f"/errors/groups/{action}"
        )

    async def _change(self, request: Request, action: str) -> Response:
        _ids, refused = await self.pages.checked_form(request)
        if refused is not None:
            return refused
        form = await request.form()
        wanted = form.get("group")
        if not isinstance(wanted, str) or not wanted:
            return self.pages.problem(request, 400, "no group chosen")
        queue = self.pages.dashboard.error_queue_name

        def change() -> int:
            groups = self._groups()
            return groups.retry(wanted) if action == "retry" else groups.delete(wanted)

        try:
            count = await self.pages.call(change)
        except exceptions.ConfigurationError as error:
            return self.pages.problem(request, 404, str(error))
        except exceptions.SqlQueueError as error:
            log.error("queue %s: dashboard could not %s group %s for %s: %s",
                      queue, action, wanted, inputs.client(request), error)
            return self.pages.problem(request, 400, str(error))
        done = "retried" if action == "retry" else "deleted"
        log.info("queue %s: dashboard %s %d message(s) of group %s for %s",
                 queue, done, count, wanted, inputs.client(request))
        prefix = str(request.scope.get("root_path", ""))
        query = urllib.parse.urlencode({"done": f"{done} {count} message(s) of group {wanted}"})
        return RedirectResponse(f"{prefix}/errors/groups?{query}", status_code=303)

    async def retry(self, request: Request) -> Response:
        """Send every message of the chosen group back to the queue it failed in."""
        return await self._change(request, "retry")

    async def delete(self, request: Request) -> Response:
        """Delete every message of the chosen group."""
        return await self._change(request, "delete")

    async def matching(self, request: Request) -> Response:
        """Ask before retrying or deleting every message that matches the errors page's filters."""
        action = self._action(request)
        if isinstance(action, Response):
            return action
        params = request.query_params
        try:
            since = inputs.utc_time("since", params.get("since"))
            until = inputs.utc_time("until", params.get("until"))
            wanted, _after = search_filter(params, since, until)
        except (inputs.BadInput, exceptions.ConfigurationError) as error:
            return self.pages.problem(request, 400, str(error))
        if not wanted.active:
            return self.pages.problem(request, 400, "no filter given: filter the errors first")

        def read() -> tuple[list[Any], bool, int]:
            queue = self.pages.dashboard.error_queue()
            page = ErrorSearch(queue).page(wanted, limit=self.most)
            return page.messages, page.next is not None, queue.count()

        try:
            chosen, more, total = await self.pages.call(read)
        except exceptions.SqlQueueError as error:
            return self.pages.problem(request, inputs.status(error), str(error))
        if more:
            return self.pages.problem(
                request,
                400,
                f"more than {self.most} messages match: narrow the filter, or "
                "retry or delete them by group",
            )
        if not chosen:
            return self.pages.problem(request, 404, "no message matches the filter any more")
        return self.pages.confirmation(
            request, "confirm.html", action, chosen=chosen, total=total, target=f"/errors/{action}"
        )
