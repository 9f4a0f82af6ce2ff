"""``sqlqueue outbox dispatch`` and ``sqlqueue outbox cleanup``.

``dispatch`` runs the :class:`~sqlqueue_orm.sending.dispatcher.OutboxDispatcher` until SIGTERM or
SIGINT (exit code 0), or with ``--once`` until nothing is due (exit status 1 when records wait for
a retry after a failed dispatch, those of earlier passes included). ``cleanup`` deletes dispatched
records older than ``--older-than`` (default ``7d``) in batches of ``--batch`` rows (default
:data:`~sqlqueue_orm.config.CLEANUP_BATCH_SIZE`), and ``OutboxDelivery`` rows as old, in this
database and in every database of ``--routes``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import exceptions
from sqlqueue_orm.cli import arguments, failures
from sqlqueue_orm.config import (
    CLEANUP_BATCH_SIZE,
    CleanupSettings,
    DispatcherSettings,
    parse_duration,
)

if TYPE_CHECKING:
    from sqlqueue_orm.sending.outbox_records import DispatchReport


def register(subparsers: Any) -> None:
    """Add ``outbox dispatch`` and ``outbox cleanup`` to the ``sqlqueue`` command line."""
    defaults = DispatcherSettings()
    outbox = subparsers.add_parser("outbox", help="dispatch and clean up the transactional outbox")
    commands = outbox.add_subparsers(dest="outbox_command", required=True, metavar="COMMAND")

    sub = commands.add_parser(
        "dispatch", help="deliver committed outbox messages (a service; --once for one pass)"
    )
    sub.add_argument("--once", action="store_true", help="dispatch what is due, then exit")
    option = arguments.defaulted_option
    option(sub, "--batch", defaults.batch_size, "records per transaction",
           type=arguments.bounded_int(1, 10_000), metavar="N")
    option(sub, "--interval", defaults.interval, "seconds between polls when idle",
           type=arguments.positive_seconds, metavar="S")
    option(sub, "--grace-period", defaults.grace_period,
           "leave records younger than this to the inline dispatch",
           type=arguments.non_negative_seconds, metavar="S")
    option(sub, "--retry-delay", defaults.retry_delay, "wait before retrying a failed record",
           type=arguments.non_negative_seconds, metavar="S")
    sub.add_argument(
        "--routes", metavar="FILE", help="JSON or TOML map of queue address to database URL"
    )
    sub.set_defaults(func=_cmd_dispatch)

    sub = commands.add_parser("cleanup", help="delete dispatched outbox records, in batches")
    option(sub, "--older-than", "7d",
           "delete records dispatched longer ago than this: 45s, 30m, 12h, 7d",
           type=_age, metavar="AGE")
    option(sub, "--batch", CLEANUP_BATCH_SIZE, "rows per delete",
           type=arguments.bounded_int(1, 100_000), metavar="N")
    sub.add_argument(
        "--routes",
        metavar="FILE",
        help="the dispatcher's routes file: clean up delivery rows in those databases too",
    )
    sub.set_defaults(func=_cmd_cleanup)


#: The settings' parameters and the options of ``outbox dispatch`` and ``outbox cleanup``.
_OPTIONS = {
    "batch_size": "--batch",
    "interval": "--interval",
    "grace_period": "--grace-period",
    "retry_delay": "--retry-delay",
    "older_than": "--older-than",
}
#: Where the settings warn about odd values.
_SETTINGS_LOGGER = "sqlqueue_orm.config"


def _cmd_dispatch(args: argparse.Namespace) -> int:
    from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
    from sqlqueue_orm.sending.outbox import Outbox
    from sqlqueue_orm.sending.routing import Routing

    with failures.named_as_options(_OPTIONS, _SETTINGS_LOGGER):
        settings = DispatcherSettings(
            batch_size=args.batch,
            interval=args.interval,
            grace_period=args.grace_period,
            retry_delay=args.retry_delay,
        )
    routing = Routing.load(args.routes) if args.routes else None
    if not args.verbose:
        # A service says what it did: one line per batch, even at the CLI's default level.
        logging.getLogger("sqlqueue_orm.sending").setLevel(logging.INFO)
    transport = args.context.transport
    with Outbox(transport, routing) as outbox:
        dispatcher = OutboxDispatcher(outbox, settings)
        dispatcher.install_signal_handlers()
        if args.once:
            report = dispatcher.dispatch_pending()
            # The table's deferred records, and those this process skips for want of a route
            # (due in the table for a dispatcher that has it): neither kind was dispatched.
            waiting = outbox.waiting_for_retry() + outbox.skipped_for_route()
            print(_once_summary(report, waiting))
            if waiting or report.deferred:
                print(
                    f"sqlqueue: error: {max(waiting, report.deferred)} outbox record(s) not "
                    "dispatched: they wait for a retry",
                    file=sys.stderr,
                )
                return failures.FAILED
            return 0
        dispatcher.run()
    return 0


def _once_summary(report: DispatchReport, waiting: int = 0) -> str:
    """What ``dispatch --once`` did, always with the number of records it deferred.

    :param waiting: records waiting for a retry now, these deferred included: those deferred in
        the table and those this dispatcher skips for want of a route.
    """
    text = dataclasses.replace(report, deferred=0).describe()
    text += f"; deferred {report.deferred} record(s)"
    if report.deferred:
        text += " (they failed and wait for a retry: see the log above)"
    earlier = waiting - report.deferred
    if earlier > 0:
        text += f"; {earlier} record(s) deferred by an earlier pass still wait for a retry"
    return text


def _age(text: str) -> str:
    """Argument type of ``--older-than``: ``45s``, ``30m``, ``12h``, ``7d`` or ``2w``, as typed."""
    try:
        parse_duration(text)
    except exceptions.ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _cmd_cleanup(args: argparse.Namespace) -> int:
    from sqlqueue_orm.sending.outbox import Outbox
    from sqlqueue_orm.sending.routing import Routing

    with failures.named_as_options(_OPTIONS, _SETTINGS_LOGGER):
        settings = CleanupSettings(
            older_than=parse_duration(args.older_than), batch_size=args.batch
        )
    routing = Routing.load(args.routes) if args.routes else None
    with Outbox(args.context.transport, routing) as outbox:
        deleted = outbox.cleanup(
            settings.older_than, batch_size=settings.batch_size, deliveries=False
        )
        deliveries = outbox.cleanup_deliveries(
            settings.older_than, batch_size=settings.batch_size
        )
    print(f"deleted {deleted} dispatched outbox record(s) older than {args.older_than}")
    if deliveries:
        print(f"deleted {deliveries} outbox delivery row(s) older than {args.older_than}")
    return 0
