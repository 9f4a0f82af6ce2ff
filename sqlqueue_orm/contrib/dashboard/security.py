"""Cross-site request protection of the dashboard's changing requests.

Every request that changes data is a POST (the routes accept no other method) and must pass two
checks, either of which alone stops a form or script on another site:

* **CSRF token.** Each browser gets a random cookie (``SameSite=Lax``, ``HttpOnly``); every
  form carries ``HMAC-SHA256(secret, cookie)`` with the dashboard's secret (random per process
  unless given). Another site can neither read the cookie nor compute the token. The cookie is
  kept for the browser's whole visit: ``Lax`` lets it come with a link followed from another
  site (``Strict`` would not, and a fresh cookie would then void the forms of pages already
  open), and a new one is issued only by a page the browser navigates to or loads itself
  (:func:`issues_cookie`), never by a refused POST or a request another site embeds.
* **Origin.** The ``Origin`` header (else the origin of ``Referer``) must be the dashboard's
  own: scheme, host and port of the request. A request that carries neither is refused.

Both trust the ``Host`` header, which a DNS-rebinding page controls (``evil.example`` made to
resolve to 127.0.0.1 is, to the browser, a site of its own that may read the dashboard's pages
and tokens). :class:`HostCheck` closes that: with the names the dashboard is reached by
(``sqlqueue dashboard`` on a loopback address allows only ``localhost``, ``127.0.0.1`` and
``::1``), a request naming any other host is answered 400 before it reaches a page.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

log = logging.getLogger("sqlqueue_orm.contrib.dashboard")

#: The host names of this machine only.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

#: The cookie that ties a browser to its CSRF token.
COOKIE = "sqlqueue_dashboard_csrf"
#: The form field of the token.
FIELD = "csrf_token"


class CsrfGuard:
    """Issues and checks the CSRF tokens of one dashboard.

    :param secret: the HMAC key; random when not given (tokens then last as long as the
        process; give one to keep them across restarts or several processes).
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        """A fresh random cookie value for a browser that has none."""
        return secrets.token_urlsafe(32)

    def token(self, cookie: str) -> str:
        """The token that forms carry for a browser whose cookie is *cookie*."""
        return hmac.new(self.secret, cookie.encode("utf-8"), hashlib.sha256).hexdigest()

    def refusal(
        self, cookie: str | None, token: str | None, origin: str | None, referer: str | None,
        own_origin: str,
    ) -> str | None:
        """Why a POST must be refused, or ``None`` when it passes both checks."""
        sent_from = origin if origin else _origin_of(referer) if referer else None
        if not sent_from or sent_from == "null":
            return "the request names no origin (no Origin or Referer header)"
        if sent_from.rstrip("/").lower() != own_origin.lower():
            return f"the request comes from another origin ({sent_from})"
        if not cookie:
            return "the CSRF cookie is missing (reload the page)"
        if not token or not hmac.compare_digest(token, self.token(cookie)):
            return "the CSRF token is missing or wrong (reload the page)"
        return None


def issues_cookie(method: str, headers: Mapping[str, str]) -> bool:
    """Whether the answer to a request that came without the cookie may set a new one.

    Only pages read with GET (or HEAD) do, and of those coming from another site
    (``Sec-Fetch-Site: cross-site``) only top-level navigations (``Sec-Fetch-Mode: navigate``,
    ``Sec-Fetch-Dest: document``): a frame, an image or a fetch of another site comes without
    the browser's ``Lax`` cookie, and a new one would replace it.

    :param method: the request's method.
    :param headers: the request's headers, by lower-case name.
    """
    if method.upper() not in ("GET", "HEAD"):
        return False
    if headers.get("sec-fetch-site", "").lower() != "cross-site":
        return True
    return (headers.get("sec-fetch-mode", "navigate").lower() == "navigate"
            and headers.get("sec-fetch-dest", "document").lower() == "document")


def _origin_of(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port (``[::1]:8800`` is ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.partition(":")[0]


class HostCheck:
    """ASGI middleware: answer 400 to HTTP requests whose ``Host`` is not one of *hosts*.

    :param app: the application to protect.
    :param hosts: the host names allowed (without ports).
    """

    def __init__(self, app: _App, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(host_name(host) if host.startswith("[") else host.lower()
                               for host in hosts)

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """Pass the request on, or refuse it."""
        if scope["type"] == "http":
            found = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if host_name(found) not in self.hosts:
                log.warning("dashboard: refused a request for host %r (allowed: %s)", found,
                            ", ".join(sorted(self.hosts)))
                text = f"host {found!r} is not one this dashboard answers to\n".encode()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(text)).encode()),
                ]})
                await send({"type": "http.response.body", "body": text})
                return
        await self.app(scope, receive, send)
