"""The endpoints page (``/endpoints``): every endpoint instance from its heartbeats.

Each instance that beat in the last day, as ``sqlqueue endpoints`` lists it: running, stale
(no heartbeat for three beats: killed, hung or cut off; the page says for how long) or stopped
(a clean stop), with its host and process, counts and rates, and what is in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlqueue_orm import exceptions, health

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, Response

    from sqlqueue_orm.transport import Transport

T = TypeVar("T")


class _Dashboard(Protocol):
    transport: Transport


class Pages(Protocol):
    """What this page needs of the dashboard's pages: its state, rendering, the thread pool."""

    @property
    def dashboard(self) -> _Dashboard:
        """The dashboard's state (its transport)."""

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking library code on the thread pool."""

    def render(
        self, request: Request, template: str, status: int = 200, **values: Any
    ) -> HTMLResponse:
        """Render *template* with the dashboard's common values."""

    def problem(self, request: Request, status: int, text: str) -> HTMLResponse:
        """A page that says what went wrong, in one line."""


class EndpointPages:
    """The request handler of ``/endpoints`` (its rendering is the dashboard's).

    :param pages: the dashboard's pages (rendering, the thread pool, problem pages).
    """

    def __init__(self, pages: Pages) -> None:
        self.pages = pages

    async def endpoints(self, request: Request) -> Response:
        """Every endpoint instance of the last day, running, stale or stopped."""
        engine = self.pages.dashboard.transport.engine
        try:
            found = await self.pages.call(health.read_endpoints, engine)
        except exceptions.SqlQueueError as error:
            return self.pages.problem(request, 503, str(error))
        rows = [
            {
                "instance": instance,
                "state": instance.state_text,
                "started": instance.record()["started_at"],
                "beat": health.format_duration(instance.silent_for),
            }
            for instance in found
        ]
        return self.pages.render(
            request, "endpoints.html", instances=rows, stale_beats=health.STALE_BEATS
        )
