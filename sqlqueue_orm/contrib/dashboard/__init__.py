"""A web dashboard of queues, the error queue, the outbox and delayed messages.

Needs the ``dashboard`` extra (``pip install sqlqueue_orm[dashboard]``: Starlette, Jinja2,
uvicorn). Importing this package imports none of them: :func:`create_app` loads them on first
use, and :func:`require_dashboard` turns a missing one into a :class:`ConfigurationError` that
says what to install.

The modules, one concern each:

* ``app``: the ASGI application, its routes and the queue, error, outbox and delayed pages;
* ``groups``: the failure groups page, the errors page's search and "all that match";
* ``control``: the control page (pause, resume and resize endpoints live) and its action log;
* ``endpoints``: the endpoints page, from the instances' heartbeats;
* ``inputs``: what every page shares: query times, action names, refusals, error statuses;
* ``security``: the CSRF token and the Origin check of every changing request;
* ``sampling``: queue depths the dashboard samples into the shared metrics table;
* ``metrics``: what the queue pages show of the metrics table (rates, charts);
* ``rendering``: the SVG depth chart and the hex view of bodies;
* ``sources``: what the pages read and change, each through the library's API.

The ``sqlqueue dashboard`` command is :mod:`sqlqueue_orm.cli.dashboard`. See ``docs/dashboard.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    from sqlqueue_orm.contrib.dashboard.app import create_app

__all__ = ["create_app", "require_dashboard"]


def require_dashboard() -> None:
    """Import Starlette and Jinja2, or raise :class:`ConfigurationError` saying what to install."""
    for name in ("starlette", "jinja2"):
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise exceptions.ConfigurationError(
                f"the dashboard needs {name} ({error}); install sqlqueue_orm[dashboard]"
            ) from error


def __getattr__(name: str) -> Any:
    """Load the application module (and Starlette) only when :func:`create_app` is used."""
    if name == "create_app":
        require_dashboard()
        return importlib.import_module(f"{__name__}.app").create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
