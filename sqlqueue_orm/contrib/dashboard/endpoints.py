"""The endpoints page (``/endpoints``): every endpoint instance from its heartbeats.

Each instance that beat in the last day, as ``sqlqueue endpoints`` lists it: running, stale
(no heartbeat for three beats: killed, hung or cut off; the page says for how long) or stopped
(a clean stop), with its host and process, counts and rates, and what is in flight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions, health

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from sqlqueue_orm.contrib.dashboard.app import _Pages


class EndpointPages:
    """The request handler of ``/endpoints`` (its rendering is the dashboard's).

    :param pages: the dashboard's pages (rendering, the thread pool, problem pages).
    """

    def __init__(self, pages: _Pages) -> None:
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
