"""The dashboard's ASGI application: queues, the error queue, the outbox, delayed messages.

::

    from sqlqueue_orm.contrib.dashboard import create_app

    app = create_app("postgresql+psycopg://app@db/shop")            # read-only
    # or mounted in your own Starlette/FastAPI application, with retry and delete allowed:
    main_app.mount("/queues", create_app(transport, allow_changes=True))

Pages only read, through the library's API (see :mod:`.sources`). Retry and delete exist only
with ``allow_changes=True``; each asks for confirmation on a page of its own, is a POST checked
by :mod:`.security` (CSRF token and Origin), and is logged with the queue name.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import pathlib
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import jinja2
from sqlalchemy.engine import Engine
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from sqlqueue_orm import exceptions
from sqlqueue_orm.contrib.dashboard import (
    control,
    endpoints,
    groups,
    metrics,
    rendering,
    sampling,
    security,
    sources,
)
from sqlqueue_orm.contrib.dashboard.inputs import (
    READ_ONLY,
    VERBS,
    BadInput,
    client,
    missing,
    status,
    unknown_action,
    utc_time,
)
from sqlqueue_orm.transport import Transport

log = logging.getLogger("sqlqueue_orm.contrib.dashboard")

T = TypeVar("T")

#: Most messages a page lists.
PAGE_SIZE = 100
#: Most messages one retry or delete takes.
MAX_CHOSEN = 1000
#: The changes the error queue's confirmation page asks about.
_ACTIONS = ("retry", "delete", "retry_all")
#: What a failed change could not do, by the word its log line uses when done.
_UNDONE = {"retried": "retry", "deleted": "delete", "retried all": "retry all"}
_TEMPLATES = pathlib.Path(__file__).with_name("templates")


class Dashboard:
    """The state of one dashboard application: its transport, sampler and CSRF guard.

    :param transport: the transport whose database the dashboard shows.
    :param allow_changes: allow retry and delete (read-only otherwise).
    :param error_queue: the name of the error queue.
    :param schemas: the schemas whose queues are listed (default: the default schema).
    :param sample_interval: seconds between depth readings (see :mod:`.sampling`).
    :param secret: the CSRF secret (random per process when not given).
    :param refresh_interval: seconds between a page's reloads of itself (``None``: never).
    """

    def __init__(
        self,
        transport: Transport,
        *,
        allow_changes: bool,
        error_queue: str,
        schemas: Sequence[str | None] | None,
        sample_interval: float,
        secret: bytes | None,
        owns_transport: bool,
        refresh_interval: float | None = None,
    ) -> None:
        # Alike the commit watcher's constructor (receiving/commit_watcher.py) only in shape.
        self.transport = transport
        self.allow_changes = allow_changes
        self.error_queue_name = error_queue
        self.schemas = list(schemas) if schemas is not None else None
        self.guard = security.CsrfGuard(secret)
        self.sampler = sampling.DepthSampler(transport, self.read_depths, sample_interval)
        self.refresh_interval = refresh_interval
        self._owns_transport = owns_transport
        self._started = False
        self._lock = threading.Lock()

    def read_depths(self) -> list[tuple[str, int]]:
        """Every listed queue with its estimated depth (peek)."""
        return self.transport.list_queues(self.schemas)

    def ensure_started(self) -> None:
        """Start sampling on first use (a mounted app may never see its lifespan)."""
        if not self._started:
            with self._lock:
                if not self._started:
                    self.sampler.start()
                    self._started = True

    def close(self) -> None:
        """Stop sampling; close the transport if the dashboard made it."""
        self.sampler.stop()
        self._started = False
        if self._owns_transport:
            self.transport.close()

    def error_queue(self) -> sources.ErrorQueue:
        """The library's error queue of this dashboard."""
        return sources.error_queue(self.transport, self.error_queue_name)


def create_app(
    transport_or_url: Transport | str | Engine,
    *,
    allow_changes: bool = False,
    error_queue: str = "error",
    schemas: Sequence[str | None] | None = None,
    sample_interval: float = 60.0,
    secret: bytes | None = None,
    allowed_hosts: Sequence[str] | None = None,
    refresh_interval: float | None = 10.0,
) -> Starlette:
    """The dashboard as an ASGI application (Starlette) you can serve or mount.

    :param transport_or_url: a :class:`Transport`, or a URL or Engine to make one from.
    :param allow_changes: offer retry and delete of error messages (read-only by default).
    :param error_queue: the error queue's name.
    :param schemas: schemas whose queues are listed (default: the default schema).
    :param sample_interval: seconds between the samples of queue depths written to the metrics
        table (see :mod:`.sampling`).
    :param secret: key of the CSRF tokens; random per process when not given.
    :param allowed_hosts: the host names the dashboard answers to (``Host`` header, without the
        port; a DNS-rebinding page names its own); ``None``: any (when mounted, your
        application decides). ``sqlqueue dashboard`` on a loopback address passes
        :data:`~.security.LOOPBACK_HOSTS`.
    :param refresh_interval: seconds between a page's reloads of itself (a pause button on
        every page; a confirmation form and the answer to a POST never reload); ``None``: never.
    """
    if isinstance(transport_or_url, Transport):
        transport, owns = transport_or_url, False
    else:
        transport, owns = Transport(transport_or_url), True
    if not sample_interval > 0:
        raise exceptions.ConfigurationError(
            f"sample_interval {sample_interval!r} must be more than 0 seconds"
        )
    if refresh_interval is not None and not refresh_interval >= 1:
        raise exceptions.ConfigurationError(
            f"refresh_interval {refresh_interval!r} must be at least 1 second (or None)"
        )
    dashboard = Dashboard(
        transport,
        allow_changes=allow_changes,
        error_queue=error_queue,
        schemas=schemas,
        sample_interval=sample_interval,
        secret=secret,
        owns_transport=owns,
        refresh_interval=refresh_interval,
    )
    pages = _Pages(dashboard)
    endpoint_pages = endpoints.EndpointPages(pages)
    group_pages = groups.GroupPages(pages, MAX_CHOSEN)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        dashboard.ensure_started()
        try:
            yield
        finally:
            dashboard.close()

    routes = [
        Route("/", pages.queues, name="queues"),
        Route("/queue", pages.queue, name="queue"),
        Route("/queue/message", pages.queue_message, name="queue_message"),
        Route("/errors", pages.errors, name="errors"),
        Route("/errors/message", pages.error_message, name="error_message"),
        Route("/errors/confirm", pages.confirm, name="confirm"),
        Route("/errors/retry", pages.retry, methods=["POST"], name="retry"),
        Route("/errors/retry-all", pages.retry_all, methods=["POST"], name="retry_all"),
        Route("/errors/delete", pages.delete, methods=["POST"], name="delete"),
        Route("/errors/groups", group_pages.groups, name="groups"),
        Route("/errors/groups/confirm", group_pages.confirm, name="group_confirm"),
        Route("/errors/groups/retry", group_pages.retry, methods=["POST"], name="group_retry"),
        Route("/errors/groups/delete", group_pages.delete, methods=["POST"], name="group_delete"),
        Route("/errors/matching", group_pages.matching, name="matching"),
        Route("/outbox", pages.outbox, name="outbox"),
        Route("/delayed", pages.delayed, name="delayed"),
        *control.ControlPages(pages).routes(),
        Route("/endpoints", endpoint_pages.endpoints, name="endpoints"),
    ]
    middleware = []
    if allowed_hosts is not None:
        middleware.append(Middleware(security.HostCheck, hosts=list(allowed_hosts)))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.dashboard = dashboard
    return app


def _limit(text: str | None) -> int:
    if not text:
        return PAGE_SIZE
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"limit {text!r} is not a whole number") from None
    if not 1 <= value <= MAX_CHOSEN:
        raise BadInput(f"limit {text!r} must be from 1 to {MAX_CHOSEN}")
    return value


class _Pages:
    """The request handlers; database work runs on Starlette's thread pool."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        # A queue as a person reads it: NServiceBus.FailedQ's "public"."billing" is "billing".
        self.env.filters["queue"] = dashboard.transport.queues.shown_name

    # -- helpers ---------------------------------------------------------------------------
    def render(
        self, request: Request, template: str, status: int = 200, **values: Any
    ) -> HTMLResponse:
        """Render *template* with the links, the CSRF token and the read-only flag."""
        self.dashboard.ensure_started()
        # A browser's cookie is kept whatever the request's Origin, Referer or Sec-Fetch-Site:
        # replacing it would void the forms of its other open pages.
        cookie = request.cookies.get(security.COOKIE) or None
        new_cookie = cookie is None
        if cookie is None:
            cookie = self.dashboard.guard.new_cookie()
        prefix = str(request.scope.get("root_path", ""))

        def link(path: str, **params: object) -> str:
            query = urllib.parse.urlencode(
                [(key, value) for key, value in params.items() if value not in (None, "")],
                doseq=True,
            )
            return prefix + path + ("?" + query if query else "")

        body = self.env.get_template(template).render(
            link=link,
            csrf_field=security.FIELD,
            csrf_token=self.dashboard.guard.token(cookie),
            allow_changes=self.dashboard.allow_changes,
            error_queue=self.dashboard.error_queue_name,
            page=template.removesuffix(".html"),
            # the answer to a POST never reloads itself: a reload would send the form again
            refresh_seconds=(
                self.dashboard.refresh_interval if request.method in ("GET", "HEAD") else None
            ),
            notice=request.query_params.get("done"),
            **values,
        )
        response = HTMLResponse(body, status_code=status)
        response.headers["X-Frame-Options"] = "DENY"  # no clickjacking of the confirm buttons
        response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
        if new_cookie and security.issues_cookie(request.method, request.headers):
            response.set_cookie(
                security.COOKIE, cookie, httponly=True, samesite="lax", path=prefix or "/"
            )
        return response

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking library code on the thread pool."""
        return await run_in_threadpool(function, *args, **kwargs)

    def problem(self, request: Request, status: int, text: str) -> HTMLResponse:
        """A page that says what went wrong, in one line."""
        return self.render(request, "problem.html", status=status, problem=text)

    def confirmation(
        self, request: Request, template: str, action: str, **values: Any
    ) -> HTMLResponse:
        """The page asking before *action*: *template* with the action and its button's verb."""
        return self.render(request, template, action=action, verb=VERBS[action], **values)

    # -- queues ----------------------------------------------------------------------------
    async def queues(self, request: Request) -> Response:
        """Every queue: depth (peek), oldest message, rates and the last hour's depth chart."""
        try:
            depths = await self.call(self.dashboard.read_depths)
            rows = await self.call(metrics.queue_rows, self.dashboard.transport, depths)
        except exceptions.SqlQueueError as error:
            return self.problem(request, status(error), str(error))
        return self.render(request, "queues.html", queues=rows,
                           interval=self.dashboard.sampler.interval)

    async def queue(self, request: Request) -> Response:
        """The oldest messages of one queue (browse: takes nothing) and its last day's metrics."""
        name = request.query_params.get("name", "")
        try:
            messages = await self.call(self.dashboard.transport.browse, name, PAGE_SIZE)
            values = await self.call(metrics.queue_page, self.dashboard.transport, name)
        except exceptions.SqlQueueError as error:
            return self.problem(request, status(error), str(error))
        return self.render(request, "queue.html", name=name, messages=messages, **values)

    async def queue_message(self, request: Request) -> Response:
        """One message of a queue: headers and body (text or hex)."""
        name = request.query_params.get("name", "")
        try:
            row_version = int(request.query_params.get("rv", ""))
        except ValueError:
            return self.problem(request, 400, "rv must be the message's RowVersion (a number)")
        try:
            found = await self.call(
                self.dashboard.transport.browse, name, 1, after=row_version - 1
            )
        except exceptions.SqlQueueError as error:
            return self.problem(request, status(error), str(error))
        if not found or found[0].row_version != row_version:
            return self.problem(request, 404, f"queue {name!r} has no message {row_version}")
        message = found[0]
        return self.render(
            request, "message.html",
            title=f"{name}: message {message.message_id}",
            headers=message.headers if message.headers_error is None else {},
            raw_headers=message.raw_headers if message.headers_error is not None else None,
            headers_error=message.headers_error,
            **_body_values(message.body or b"", request),
            failure=None, message_id=message.message_id, id=None,
            back=("queue", {"name": name}),
        )

    # -- the error queue -------------------------------------------------------------------
    async def errors(self, request: Request) -> Response:
        """The error queue, filtered by exception type, endpoint and time of failure."""
        params = request.query_params
        filters = {
            "exception_type": params.get("exception_type") or None,
            "endpoint": params.get("endpoint") or None,
        }
        try:
            since = utc_time("since", params.get("since"))
            until = utc_time("until", params.get("until"))
            limit = _limit(params.get("limit"))
            wanted, after = groups.search_filter(params, since, until)
        except (BadInput, exceptions.ConfigurationError) as error:
            return self.problem(request, 400, str(error))

        def read() -> tuple[int, groups.Page, list[str], list[str]]:
            queue = self.dashboard.error_queue()
            listed = groups.ErrorSearch(queue).page(wanted, after=after, limit=limit)
            everything = queue.list(limit=MAX_CHOSEN)  # the choices of the filters
            types = sorted({m.exception_type for m in everything if m.exception_type})
            endpoints = sorted({m.processing_endpoint for m in everything
                                if m.processing_endpoint})
            return queue.count(), listed, types, endpoints

        try:
            total, listed, types, endpoints = await self.call(read)
        except exceptions.SqlQueueError as error:
            return self.problem(request, status(error), str(error))
        return self.render(
            request, "errors.html", total=total, messages=listed.messages, types=types,
            endpoints=endpoints, limit=limit, filters={
                **filters, "since": params.get("since") or "", "until": params.get("until") or "",
                **{name: params.get(name) or "" for name in groups.FILTER_PARAMS[:4]},
            }, next=listed.next, after=after, searching=wanted.active,
        )

    async def error_message(self, request: Request) -> Response:
        """One failed message: why it failed, its headers and body (text or hex)."""
        identity = request.query_params.get("id", "")
        try:
            failed = await self.call(lambda: self.dashboard.error_queue().get(identity))
        except exceptions.SqlQueueError as error:
            return self.problem(request, 404 if missing(error) else 400, str(error))
        if failed is None:
            return self.problem(
                request, 404, f"the error queue has no message {identity!r} (retried or deleted?)"
            )
        raw = failed.raw_headers
        return self.render(
            request, "message.html",
            title=f"{self.dashboard.error_queue_name}: message {failed.message_id}",
            headers=failed.headers,
            raw_headers=None if failed.headers else raw,
            headers_error=None,
            **_body_values(failed.body, request),
            failure=failed, message_id=failed.message_id, id=failed.id,
            back=("errors", {}),
        )

    async def confirm(self, request: Request) -> Response:
        """Ask before a retry or delete: what will be done to which messages."""
        if not self.dashboard.allow_changes:
            return self.problem(request, 403, READ_ONLY)
        action = request.query_params.get("action", "")
        if action not in _ACTIONS:
            return self.problem(request, 400, unknown_action(action, _ACTIONS))
        ids = request.query_params.getlist("id")[: MAX_CHOSEN + 1]
        if action != "retry_all" and not ids:
            return self.problem(request, 400, "no message chosen: tick at least one")
        if len(ids) > MAX_CHOSEN:
            return self.problem(request, 400, f"at most {MAX_CHOSEN} messages at a time")

        def read() -> tuple[list[sources.FailedMessage], int]:
            queue = self.dashboard.error_queue()
            return [m for m in (queue.get(i) for i in ids) if m is not None], queue.count()

        try:
            chosen, total = await self.call(read)
        except exceptions.SqlQueueError as error:
            return self.problem(request, 400, str(error))
        if action != "retry_all" and not chosen:
            return self.problem(request, 404, "none of the chosen messages is in the error "
                                "queue any more")
        target = {"retry": "/errors/retry", "delete": "/errors/delete",
                  "retry_all": "/errors/retry-all"}[action]
        return self.confirmation(request, "confirm.html", action, chosen=chosen, total=total,
                                 target=target)

    async def checked_form(self, request: Request) -> tuple[list[str], Response | None]:
        """The chosen ids of a changing POST, or the response that refuses it."""
        if not self.dashboard.allow_changes:
            return [], self.problem(request, 403, READ_ONLY)
        form = await request.form()
        token = form.get(security.FIELD)
        own = f"{request.url.scheme}://{request.url.netloc}"
        refusal = self.dashboard.guard.refusal(
            request.cookies.get(security.COOKIE),
            token if isinstance(token, str) else None,
            request.headers.get("origin"),
            request.headers.get("referer"),
            own,
        )
        if refusal is not None:
            log.warning("queue %s: dashboard refused a %s from %s: %s",
                        self.dashboard.error_queue_name, request.url.path, client(request),
                        refusal)
            return [], self.problem(request, 403, f"refused: {refusal}")
        if form.get("confirmed") != "yes":
            return [], self.problem(request, 400, "not confirmed: use the confirmation page")
        ids = [value for value in form.getlist("id") if isinstance(value, str)]
        if len(ids) > MAX_CHOSEN:
            return [], self.problem(request, 400, f"at most {MAX_CHOSEN} messages at a time")
        return ids, None

    def _done(self, request: Request, text: str) -> Response:
        prefix = str(request.scope.get("root_path", ""))
        query = urllib.parse.urlencode({"done": text})
        return RedirectResponse(f"{prefix}/errors?{query}", status_code=303)

    async def _change(
        self, request: Request, verb: str, change: Callable[[sources.ErrorQueue, list[str]], int]
    ) -> Response:
        ids, refused = await self.checked_form(request)
        if refused is not None:
            return refused
        if not ids and verb != "retried all":
            return self.problem(request, 400, "no message chosen")
        try:
            count = await self.call(lambda: change(self.dashboard.error_queue(), ids))
        except exceptions.SqlQueueError as error:
            log.error("queue %s: dashboard could not %s message(s)%s for %s: %s",
                      self.dashboard.error_queue_name, _UNDONE[verb],
                      f" ({', '.join(ids)})" if ids else "", client(request), error)
            return self.problem(request, 400, str(error))
        log.info("queue %s: dashboard %s %d message(s)%s for %s",
                 self.dashboard.error_queue_name, verb, count,
                 f" ({', '.join(ids)})" if ids else "", client(request))
        return self._done(request, f"{verb} {count} message(s)")

    async def retry(self, request: Request) -> Response:
        """Send the chosen messages back to the queues they failed in."""
        return await self._change(request, "retried", lambda queue, ids: queue.retry(ids))

    async def retry_all(self, request: Request) -> Response:
        """Send every message of the error queue back to the queue it failed in."""
        return await self._change(request, "retried all", lambda queue, _ids: queue.retry_all())

    async def delete(self, request: Request) -> Response:
        """Delete the chosen messages from the error queue."""
        return await self._change(request, "deleted", lambda queue, ids: queue.delete(ids))

    # -- outbox and delayed ----------------------------------------------------------------
    async def outbox(self, request: Request) -> Response:
        """The outbox backlog, its oldest record and the records waiting for a retry."""
        try:
            backlog, retrying = await self.call(sources.outbox_backlog, self.dashboard.transport)
        except exceptions.SchemaOutdated as error:  # backlog(): the table does not exist
            return self.render(request, "outbox.html", backlog=None, missing=error.table)
        except exceptions.SqlQueueError as error:
            return self.problem(request, 503, str(error))
        return self.render(
            request, "outbox.html", backlog=backlog, retrying=retrying, missing=None
        )

    async def delayed(self, request: Request) -> Response:
        """Delayed messages of every delayed table (or one endpoint's), earliest due first."""
        endpoint = request.query_params.get("endpoint") or None
        try:
            limit = _limit(request.query_params.get("limit"))
            waiting = await self.call(
                self.dashboard.transport.browse_delayed, endpoint, self.dashboard.schemas, limit
            )
        except BadInput as error:
            return self.problem(request, 400, str(error))
        except exceptions.ConfigurationError as error:  # an endpoint with no delayed table
            return self.problem(request, 404, str(error))
        except exceptions.SqlQueueError as error:
            return self.problem(request, 503, str(error))
        now = dt.datetime.now(dt.UTC)
        rows = [
            {"message": message, "in": _remaining(message.due - now),
             "size": len(message.body or b"")}
            for message in waiting
        ]
        return self.render(request, "delayed.html", rows=rows, endpoint=endpoint or "",
                           limit=limit)


def _remaining(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds <= 0:
        return "due now"
    if seconds < 120:
        return f"in {seconds:.0f} s"
    if seconds < 7200:
        return f"in {seconds / 60:.0f} min"
    return f"in {seconds / 3600:.1f} h"


def _body_values(body: bytes, request: Request) -> dict[str, Any]:
    text = rendering.utf8_text(body)
    as_hex = request.query_params.get("view") == "hex" or text is None
    return {
        "size": len(body),
        "is_text": text is not None,
        "as_hex": as_hex,
        "body_text": rendering.hex_view(body) if as_hex else text,
        "hex_link": str(request.url.include_query_params(view="hex")),
        "text_link": str(request.url.remove_query_params("view")),
    }
