"""Routing: which database each destination queue lives in.

A :class:`Routing` maps queue addresses to database URLs. A destination it does not name lives
in the local database (the unit of work's or the dispatcher's own). A :class:`Router` resolves
destinations to transports, opening one engine per remote URL and reusing it.

A routes file (``sqlqueue outbox dispatch --routes FILE``) is JSON or TOML, a table of address to
URL, either at the top level or under ``routes``::

    # routes.toml
    [routes]
    "billing" = "postgresql+psycopg://app@billing-db/billing"
    "shipping@[logistics]" = "mssql+pyodbc://app@erp/Erp?driver=ODBC+Driver+18+for+SQL+Server"
"""

from __future__ import annotations

import json
import logging
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc

from sqlqueue_orm import addressing, exceptions
from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)


class Routing:
    """A map from queue address to the URL of the database holding that queue.

    :param routes: address (``table@[schema]@[catalog]`` or a :class:`QueueAddress`) to URL.
    :raises ConfigurationError: naming an address or URL that cannot be used.
    """

    def __init__(self, routes: Mapping[str | addressing.QueueAddress, str] | None = None) -> None:
        self._routes: dict[addressing.QueueAddress, str] = {}
        for key, url in (routes or {}).items():
            address = addressing.QueueAddress.coerce(key)
            if not isinstance(url, str) or not url.strip():
                raise exceptions.ConfigurationError(
                    f"route of queue {str(address)!r}: URL {url!r} is not a non-empty string"
                )
            try:
                sa.make_url(url)
            except exc.ArgumentError as error:
                raise exceptions.ConfigurationError(
                    f"route of queue {str(address)!r}: {url!r} is not a database URL"
                ) from error
            self._routes[address] = url

    def __repr__(self) -> str:
        return f"Routing({len(self._routes)} route(s))"

    def __len__(self) -> int:
        return len(self._routes)

    def urls(self) -> list[str]:
        """The distinct database URLs the routes lead to, in the order first named."""
        return list(dict.fromkeys(self._routes.values()))

    def url_for(self, queue: str | addressing.QueueAddress) -> str | None:
        """The URL of the database holding *queue*, or ``None`` for the local database."""
        return self._routes.get(addressing.QueueAddress.coerce(queue))

    @classmethod
    def load(cls, path: str | Path) -> Routing:
        """Read a routes file: JSON (``.json``) or TOML (anything else).

        :raises ConfigurationError: naming the file and what is wrong with it.
        """
        file = Path(path)
        try:
            raw = file.read_bytes()
        except OSError as error:
            raise exceptions.ConfigurationError(
                f"routes file {str(file)!r} cannot be read: {error.strerror}"
            ) from error
        data: Any
        try:
            if file.suffix.lower() == ".json":
                data = json.loads(raw)
            else:
                data = tomllib.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            kind = "JSON" if file.suffix.lower() == ".json" else "TOML"
            raise exceptions.ConfigurationError(
                f"routes file {str(file)!r} is not valid {kind}: {error}"
            ) from error
        if isinstance(data, dict) and isinstance(data.get("routes"), dict):
            data = data["routes"]
        if not isinstance(data, dict):
            raise exceptions.ConfigurationError(
                f"routes file {str(file)!r} must hold a table of queue address to database URL"
            )
        try:
            return cls(data)
        except exceptions.ConfigurationError as error:
            raise exceptions.ConfigurationError(f"routes file {str(file)!r}: {error}") from error


class Router:
    """Resolves destinations to transports: the local one, or one per remote database URL.

    :param transport: the local transport (its database is where the outbox lives).
    :param routing: where remote queues live; ``None`` means every queue is local.
    """

    def __init__(self, transport: Transport, routing: Routing | None = None) -> None:
        self.transport = transport
        self.routing = routing or Routing()
        self._remote: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def is_local(self, queue: str | addressing.QueueAddress) -> bool:
        """Whether *queue* lives in the local database."""
        url = self.routing.url_for(queue)
        if url is None:
            return True
        return sa.make_url(url) == self.transport.engine.url

    def transport_for(self, queue: str | addressing.QueueAddress) -> Transport:
        """The transport of the database holding *queue* (remote ones are opened once)."""
        if self.is_local(queue):
            return self.transport
        url = self.routing.url_for(queue)
        assert url is not None  # is_local said it is routed
        return self._open(url, f"queue {queue}")

    def remote_transports(self) -> list[Transport]:
        """The transport of every routed database other than the local one (opened once)."""
        local = self.transport.engine.url
        return [
            self._open(url, "routes")
            for url in self.routing.urls()
            if sa.make_url(url) != local
        ]

    def _open(self, url: str, why: str) -> Transport:
        remote = self._remote.get(url)
        if remote is None:
            with self._lock:
                remote = self._remote.get(url)
                if remote is None:
                    remote = Transport(url)
                    self._remote[url] = remote
                    log.info(
                        "%s: routed to %s",
                        why,
                        sa.make_url(url).render_as_string(hide_password=True),
                    )
        return remote

    def close(self) -> None:
        """Dispose of the engines of remote databases."""
        with self._lock:
            remotes, self._remote = list(self._remote.values()), {}
        for remote in remotes:
            remote.close()
