"""``sqlqueue run MODULE:ENDPOINT``: run an endpoint until SIGTERM/SIGINT, or until drained.

``ENDPOINT`` names, in the importable module ``MODULE`` (the working directory is on the path),
an :class:`~sqlqueue_orm.receiving.endpoint.Endpoint` or an
:class:`~sqlqueue_orm.aio.AsyncEndpoint` (run by ``asyncio.run``), or a function that takes the
:class:`~sqlqueue_orm.transport.Transport` of ``--url`` and returns one. On a terminal a one-line
status is kept up to date (received, failed, in flight, rate); otherwise a plain log line is
written every ``STATUS_EVERY`` seconds. At the end one line gives the totals and the rate, in
messages (a message retried at once counts once), with how many wait for a delayed retry.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import arguments

if TYPE_CHECKING:
    from sqlqueue_orm.aio import AsyncEndpoint
    from sqlqueue_orm.receiving.endpoint import Endpoint
    from sqlqueue_orm.receiving.pump import PumpStats

# Under ``sqlqueue_orm.receiving``, whose level the command raises to INFO: the status lines
# show by default, and log settings naming this logger keep applying.
log = logging.getLogger("sqlqueue_orm.receiving.commands")

#: Seconds between status log lines when standard error is not a terminal.
STATUS_EVERY = 10.0


@dataclasses.dataclass(frozen=True)
class Reference:
    """``MODULE:ATTRIBUTE`` as typed, and the object it names."""

    text: str
    target: Any


def endpoint_reference(text: str) -> Reference:
    """Argument type ``MODULE:ATTRIBUTE``: the object it names (imported now)."""
    module_name, sep, attribute = text.partition(":")
    if not sep or not module_name or not attribute:
        raise argparse.ArgumentTypeError(f"{text!r} is not MODULE:ENDPOINT")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the working directory, as ``python -m`` has it
    # Alike the Transport's engine creation only in shape: each names its own failure.
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise argparse.ArgumentTypeError(
            f"cannot import module {module_name!r} of {text!r}: {error}"
        ) from None
    except exceptions.ConfigurationError as error:  # an endpoint it sets up refused a setting
        raise argparse.ArgumentTypeError(f"module {module_name!r} of {text!r}: {error}") from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise argparse.ArgumentTypeError(
                f"module {module_name!r} has no {attribute!r} (in {text!r})"
            ) from None
    return Reference(text, target)


#: What ``MODULE:ENDPOINT`` is, in ``sqlqueue run --help``.
ENDPOINT_HELP = (
    "MODULE is an importable module path (billing, or shop.billing; the working directory is "
    "on the path) and ENDPOINT the name of an Endpoint object in it (or an AsyncEndpoint), or "
    "of a function that takes a Transport and returns one"
)


#: ``--wakeup``: each mode's settings (EndpointSettings.notify and .wakeup).
WAKEUP_MODES: dict[str, dict[str, Any]] = {
    "auto": {"notify": None, "wakeup": "auto"},
    "required": {"notify": True, "wakeup": "auto"},
    "poll": {"notify": None, "wakeup": "poll"},
    "off": {"notify": False, "wakeup": "auto"},
}


def wakeup_mode(text: str) -> str:
    """Argument type: one of :data:`WAKEUP_MODES`."""
    if text not in WAKEUP_MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(WAKEUP_MODES)}")
    return text


def register(subparsers: Any) -> None:
    """Add ``run`` to the ``sqlqueue`` command line."""
    sub = subparsers.add_parser(
        "run",
        help="run an endpoint: MODULE:ENDPOINT, a module path and the name of an Endpoint in it",
        description=f"Run an endpoint until SIGTERM or SIGINT (--once: until its queue is "
        f"drained). {ENDPOINT_HELP}.",
    )
    sub.add_argument(
        "endpoint", type=endpoint_reference, metavar="MODULE:ENDPOINT", help=ENDPOINT_HELP
    )
    sub.add_argument(
        "--concurrency",
        type=arguments.bounded_int(1, 1_000),
        metavar="N",
        help="messages handled at once (default: the endpoint's setting)",
    )
    sub.add_argument(
        "--wakeup",
        type=wakeup_mode,
        metavar="MODE",
        help="how the idle endpoint hears of other processes' sends: auto (where the database "
        "and connection can), required, poll (burst polling, behind PgBouncer), off "
        "(default: the endpoint's setting)",
    )
    sub.add_argument("--once", action="store_true", help="stop when the queue is drained")
    # its endpoint creates its queues at start-up: a new SQLite file is made for them
    sub.set_defaults(func=_cmd_run, creates_database=True)


def _resolve(reference: Reference, args: argparse.Namespace) -> Endpoint | AsyncEndpoint:
    from sqlqueue_orm.aio import AsyncEndpoint
    from sqlqueue_orm.receiving.endpoint import Endpoint

    endpoint = reference.target
    if not isinstance(endpoint, Endpoint | AsyncEndpoint | type) and callable(endpoint):
        endpoint = endpoint(args.context.transport)
    if not isinstance(endpoint, Endpoint | AsyncEndpoint):
        raise exceptions.ConfigurationError(
            f"{reference.text!r} is neither an Endpoint nor a function returning one"
        )
    return endpoint


def _totals(endpoint: Endpoint | AsyncEndpoint) -> PumpStats:
    """The counters of the input queue and the instance-specific queue, added up."""
    from sqlqueue_orm.receiving.endpoint import Endpoint
    from sqlqueue_orm.receiving.pump import PumpStats

    parts = (
        (endpoint.stats, endpoint.instance_stats)
        if isinstance(endpoint, Endpoint)
        else (endpoint.stats,)
    )
    fields = (
        "handled", "failed", "retried", "delayed", "expired", "poison", "in_flight",
        "max_in_flight",
    )
    totals = PumpStats(**{name: sum(getattr(part, name) for part in parts) for name in fields})
    totals.started = endpoint.stats.started
    return totals


def _status(stats: PumpStats) -> str:
    return (
        f"received {stats.received}, handled {stats.handled}, failed {stats.failed}, "
        f"in flight {stats.in_flight}, {stats.rate():.0f} msg/s"
    )


def _cmd_run(args: argparse.Namespace) -> int:
    endpoint = _resolve(args.endpoint, args)
    if args.concurrency is not None:
        endpoint.settings = endpoint.settings.replace(concurrency=args.concurrency)
    if args.wakeup is not None:
        endpoint.settings = endpoint.settings.replace(**WAKEUP_MODES[args.wakeup])
    if not args.verbose:
        logging.getLogger("sqlqueue_orm.receiving").setLevel(logging.INFO)
    done = threading.Event()
    terminal = sys.stderr.isatty()

    def report() -> None:
        last = time.monotonic()
        while not done.wait(0.5):
            if terminal:
                sys.stderr.write("\r" + _status(_totals(endpoint)).ljust(78))
                sys.stderr.flush()
            elif time.monotonic() - last >= STATUS_EVERY:
                last = time.monotonic()
                log.info("queue %s: %s", endpoint.name, _status(_totals(endpoint)))

    reporter = threading.Thread(target=report, name="status", daemon=True)
    reporter.start()
    began = time.monotonic()
    try:
        from sqlqueue_orm.aio import AsyncEndpoint

        if isinstance(endpoint, AsyncEndpoint):
            import asyncio  # here: every other command starts without it

            asyncio.run(endpoint.run(once=args.once))
        else:
            endpoint.run(once=args.once)
    finally:
        done.set()
        reporter.join(1)
        if terminal:
            sys.stderr.write("\n")
    print(summary(endpoint.name, _totals(endpoint), time.monotonic() - began))
    return 0


def summary(queue: str, stats: PumpStats, elapsed: float) -> str:
    """The last line of ``run``: messages (not attempts), what became of them, the rate.

    A message retried at once is received again, so it is one message and several receives;
    one that failed its immediate retries waits for a delayed retry (in the delayed table).
    """
    messages = stats.received - stats.retried
    rate = messages / elapsed if elapsed > 0 else 0.0
    return (
        f"queue {queue}: {messages} message(s) in {elapsed:.1f} s ({rate:.0f} msg/s): "
        f"handled {stats.handled}, failed {stats.failed}, "
        f"waiting for a delayed retry {stats.delayed}, expired {stats.expired}, "
        f"poison {stats.poison} ({stats.received} receive(s), {stats.retried} of them "
        "immediate retries)"
    )
