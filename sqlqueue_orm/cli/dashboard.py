"""``sqlqueue dashboard``: serve the dashboard of the ``--url`` database with uvicorn.

Binds to 127.0.0.1:8800 by default, read-only unless ``--allow-changes``. The port is bound
before the server starts, so a port in use is one line naming it (exit 2), and an unreachable
database one line naming host and cause (exit 1), as everywhere in the CLI. The
:mod:`sqlqueue_orm.contrib.dashboard` package is imported when the command runs: the extra may be
absent.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import socket
from typing import Any

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import arguments

log = logging.getLogger("sqlqueue_orm.contrib.dashboard")

#: The default address: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: The default port.
DEFAULT_PORT = 8800


def _host(text: str) -> str:
    text = arguments.utf8_text(text).strip()
    if not text or any(character.isspace() for character in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name or address")
    return text


def is_loopback(host: str) -> bool:
    """Whether *host* is this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A socket bound and listening on *host*:*port* (``ConfigurationError`` naming them)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise exceptions.ConfigurationError(
            f"--host {host!r}: cannot resolve it ({error.strerror})"
        ) from error
    family, kind, protocol, _name, address = infos[0]
    sock = socket.socket(family, kind, protocol)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise exceptions.ConfigurationError(
            f"--port {port}: cannot listen on {host}:{port} ({error.strerror or error})"
        ) from error
    return sock


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from sqlqueue_orm.contrib import dashboard
    from sqlqueue_orm.contrib.dashboard import security

    dashboard.require_dashboard()
    import uvicorn

    transport = args.context.transport  # reaches the database first: exit 1 if it cannot
    app = dashboard.create_app(
        transport,
        allow_changes=args.allow_changes,
        error_queue=args.error_queue,
        sample_interval=args.sample_interval,
        # On this machine only, refuse other host names: a DNS-rebinding page could otherwise
        # read the pages (and their CSRF tokens) through the browser.
        allowed_hosts=security.LOOPBACK_HOSTS if is_loopback(args.host) else None,
    )
    sock = listen(args.host, args.port)
    # Actions are logged at INFO: shown by default, with the queue in each line.
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    if not is_loopback(args.host):
        log.warning("dashboard: listening on %s, not only on this machine: anyone who can reach "
                    "it reads every queue%s", args.host,
                    " and can retry and delete error messages" if args.allow_changes else "")
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"sqlqueue dashboard of the {args.context.where} on http://{shown}:{port}/ "
          f"({'retry and delete allowed' if args.allow_changes else 'read-only'}); "
          "Ctrl+C stops it", flush=True)
    config = uvicorn.Config(app, log_level="warning" if not args.verbose else "info",
                            access_log=bool(args.verbose), lifespan="on")
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again for the previous
    # handler: that is the end of a normal run here, not an interruption.
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    print("sqlqueue dashboard stopped", flush=True)
    return 0


def register(commands: Any) -> None:
    """Add ``dashboard`` to the ``sqlqueue`` parser."""
    sub = commands.add_parser("dashboard", help="web dashboard of queues, errors and the outbox")
    sub.add_argument("--host", type=_host, default=DEFAULT_HOST,
                     help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    sub.add_argument("--port", type=arguments.bounded_int(0, 65535), default=DEFAULT_PORT,
                     help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    sub.add_argument("--allow-changes", action="store_true",
                     help="offer retry and delete of error messages (read-only without it)")
    sub.add_argument("--error-queue", default="error", metavar="QUEUE",
                     help="the error queue (default: error)")
    sub.add_argument("--sample-interval", type=arguments.positive_seconds, default=60.0,
                     metavar="SECONDS",
                     help="seconds between the depth samples written to the metrics table")
    sub.set_defaults(func=_cmd_dashboard)
