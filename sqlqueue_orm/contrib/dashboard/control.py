"""The dashboard's control page: pause, resume and resize endpoints live, and the action log.

``/control`` lists the endpoints: those with an instance that beat in the last day
(:func:`sqlqueue_orm.health.read_endpoints`) or with a control row, each with its state (running
or paused, concurrency override), and the action log, newest first. With ``allow_changes=True``
it offers pause, resume and a concurrency form; each asks for confirmation on a page of its own
(``/control/confirm``), then is a POST to ``/control/change`` checked by :mod:`.security` (CSRF
token and Origin), made through :mod:`sqlqueue_orm.control` as this host's user from the
client's address, and logged.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from sqlqueue_orm import control, exceptions, health
from sqlqueue_orm.contrib.dashboard import inputs
from sqlqueue_orm.transport import Transport

__all__ = ["READ_ONLY", "ControlPages", "Pages", "concurrency_value"]

log = logging.getLogger("sqlqueue_orm.contrib.dashboard")

T = TypeVar("T")

#: Most action-log rows the page shows.
LOG_ROWS = 50
#: The changes the control page's confirmation asks about.
_ACTIONS = ("pause", "resume", "concurrency")


class _Dashboard(Protocol):
    @property
    def transport(self) -> Transport: ...
    @property
    def allow_changes(self) -> bool: ...


class Pages(Protocol):
    """What the control page uses of the dashboard's pages (:class:`.app._Pages`)."""

    @property
    def dashboard(self) -> _Dashboard:
        """The dashboard's state (:class:`.app.Dashboard`)."""

    def render(
        self, request: Request, template: str, status: int = 200, **values: Any
    ) -> HTMLResponse:
        """Render *template* with the links, the CSRF token and the read-only flag."""

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking library code on the thread pool."""

    def problem(self, request: Request, status: int, text: str) -> HTMLResponse:
        """A page that says what went wrong, in one line."""

    def confirmation(
        self, request: Request, template: str, action: str, **values: Any
    ) -> HTMLResponse:
        """The page asking before *action*: *template* with the action and its button's verb."""

    async def checked_form(self, request: Request) -> tuple[list[str], Response | None]:
        """The refusal of a changing POST (read-only, CSRF, Origin, not confirmed), or None."""


def concurrency_value(text: str | None) -> int | None:
    """The concurrency a form gives: a whole number from 1, or empty/``default`` for None.

    :raises ConfigurationError: anything else, naming the value.
    """
    if text is None or text.strip() in ("", "default"):
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise exceptions.ConfigurationError(f"concurrency {text!r} is not a whole number") from None
    if not 1 <= value <= control.MAX_CONCURRENCY:
        raise exceptions.ConfigurationError(
            f"concurrency {text!r} must be from 1 to {control.MAX_CONCURRENCY}"
        )
    return value


def _client(request: Request) -> str | None:
    client = request.client
    return f"{client.host}:{client.port}" if client else None


class ControlPages:
    """The request handlers of ``/control`` (see the module docstring)."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages

    def routes(self) -> list[Route]:
        """The routes to register in the dashboard's application."""
        return [
            Route("/control", self.page, name="control"),
            Route("/control/confirm", self.confirm, name="control_confirm"),
            Route("/control/change", self.change, methods=["POST"], name="control_change"),
        ]

    def _read(self) -> tuple[list[dict[str, Any]], list[control.LoggedAction]]:
        dashboard = self.pages.dashboard
        transport = dashboard.transport
        rows = {state.endpoint: state for state in control.states(transport)}
        # endpoints, not queues: a queue no endpoint ever ran on is not one
        beating = {instance.endpoint for instance in health.read_endpoints(transport.engine)}
        names = sorted(beating | set(rows))
        endpoints = [{"name": name, "state": rows.get(name)} for name in names]
        return endpoints, control.log(transport, limit=LOG_ROWS)

    async def page(self, request: Request) -> Response:
        """Every endpoint with its control state and forms, and the action log."""
        try:
            endpoints, actions = await self.pages.call(self._read)
        except exceptions.SqlQueueError as error:
            return self.pages.problem(request, 503, str(error))
        return self.pages.render(request, "control.html", endpoints=endpoints, actions=actions)

    def _action(self, request: Request, values: Any) -> tuple[str, str, int | None] | HTMLResponse:
        """The (action, endpoint, concurrency) of a query or form, or the page refusing it."""
        action = str(values.get("action") or "")
        endpoint = str(values.get("endpoint") or "")
        if action not in _ACTIONS:
            return self.pages.problem(request, 400, inputs.unknown_action(action, _ACTIONS))
        if not endpoint:
            return self.pages.problem(request, 400, "no endpoint named")
        concurrency = None
        if action == "concurrency":
            try:
                concurrency = concurrency_value(values.get("concurrency"))
            except exceptions.ConfigurationError as error:
                return self.pages.problem(request, 400, str(error))
        return action, endpoint, concurrency

    async def confirm(self, request: Request) -> Response:
        """Ask before a pause, resume or concurrency change: what will be done to which endpoint."""
        if not self.pages.dashboard.allow_changes:
            return self.pages.problem(request, 403, READ_ONLY)
        chosen = self._action(request, request.query_params)
        if isinstance(chosen, HTMLResponse):
            return chosen
        action, endpoint, concurrency = chosen
        try:
            state = await self.pages.call(control.state, self.pages.dashboard.transport, endpoint)
        except exceptions.SqlQueueError as error:
            return self.pages.problem(request, 503, str(error))
        return self.pages.confirmation(
            request, "control_confirm.html", action,
            endpoint=endpoint, concurrency=concurrency, state=state,
        )

    async def change(self, request: Request) -> Response:
        """Make the confirmed change, as this host's user from the client's address."""
        _ids, refused = await self.pages.checked_form(request)
        if refused is not None:
            return refused
        chosen = self._action(request, await request.form())
        if isinstance(chosen, HTMLResponse):
            return chosen
        action, endpoint, concurrency = chosen
        by = control.Actor.here(client=_client(request))
        transport = self.pages.dashboard.transport

        def apply() -> control.ControlState:
            if action == "pause":
                return control.pause(transport, endpoint, by=by)
            if action == "resume":
                return control.resume(transport, endpoint, by=by)
            return control.set_concurrency(transport, endpoint, concurrency, by=by)

        try:
            await self.pages.call(apply)
        except exceptions.ConfigurationError as error:
            return self.pages.problem(request, 400, str(error))
        except exceptions.SqlQueueError as error:
            log.error("queue %s: dashboard could not %s, by %s: %s", endpoint, action, by, error)
            return self.pages.problem(request, 503, str(error))
        done = _done_text(action, endpoint, concurrency)
        log.info("queue %s: dashboard: %s, by %s", endpoint, done, by)
        prefix = str(request.scope.get("root_path", ""))
        query = urllib.parse.urlencode({"done": done})
        return RedirectResponse(f"{prefix}/control?{query}", status_code=303)


def _done_text(action: str, endpoint: str, concurrency: int | None) -> str:
    if action == "pause":
        return f"paused {endpoint}"
    if action == "resume":
        return f"resumed {endpoint}"
    shown = "its configured one" if concurrency is None else str(concurrency)
    return f"set the concurrency of {endpoint} to {shown}"


#: Why a change is refused by a read-only dashboard.
READ_ONLY = (
    "the dashboard is read-only: start it with --allow-changes "
    "(create_app(..., allow_changes=True)) to pause, resume or resize endpoints"
)
