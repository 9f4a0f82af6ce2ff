"""The ``sqlqueue`` command line.

The database URL comes from ``--url``, else ``SQLQUEUE_URL``, else ``sqlite:///sqlqueue.db``; it
is resolved once into a :class:`~sqlqueue_orm.cli.context.CommandContext` (``args.context``) that
every command gets, with one Transport made on first use. One module per command group, each
with a ``register(subparsers)`` function, in the order ``sqlqueue --help`` lists them:

* ``queues``: create-queue, send, receive, browse, peek, purge-expired, purge-all, list-queues;
* ``ddl``: the DDL of queue tables for a DBA;
* ``verify``: drifts of the tables from their layout, with their repairs;
* ``migrate``: Alembic upgrades of queue and shared tables;
* ``outbox``: dispatch and clean up the transactional outbox;
* ``run``: run an endpoint;
* ``endpoints``: the endpoint instances, running, stale or stopped, from their heartbeats;
* ``delayed``: the delayed messages waiting;
* ``errors``: list, show, retry and delete the messages of an error queue;
* ``subscriptions``: the subscription table;
* ``spark`` and ``dashboard``: the optional extras, whose packages load only when their command
  runs (the extra may be absent);
* ``control``: pause, resume and resize running endpoints live, and the log of who did.

Beside them: ``arguments`` (every argument type, validated one way), ``context`` (the URL and the
Transport), ``listings`` (how every listing prints, ``--json`` or not, empty or not) and
``failures`` (the one error policy: bad input exits 2, an unreachable database 1, one line each, a
traceback only with ``--verbose``). ``--url`` is accepted before the command and after it. The
library never imports this package: the command line is an application on top of it.

A command imports SQLAlchemy and the library modules it uses when it runs, not when its module
is imported: building the parser (``sqlqueue --help``, or any command before it starts) loads
neither, and the values the parser shows (dialects, limits, defaults) come from
:mod:`sqlqueue_orm.config`, which needs no SQLAlchemy.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

import sqlqueue_orm
from sqlqueue_orm.cli import (
    arguments,
    context,
    control,
    dashboard,
    ddl,
    delayed,
    endpoints,
    errors,
    failures,
    migrate,
    outbox,
    queues,
    run,
    spark,
    subscriptions,
    verify,
)
from sqlqueue_orm.cli.arguments import key_value, positive_int, positive_seconds, resolve_url
from sqlqueue_orm.cli.ddl import ddl_dialect

log = logging.getLogger("sqlqueue_orm.cli")

#: The command groups, in the order ``sqlqueue --help`` lists them.
GROUPS = (
    queues, ddl, verify, migrate, outbox, run, endpoints, control, delayed, errors, subscriptions,
    spark, dashboard,
)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("sqlqueue_orm")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        return sqlqueue_orm.__version__


class _VersionAction(argparse.Action):
    """``--version``: print ``sqlqueue VERSION`` and exit; the version is read only then."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"sqlqueue {_version()}")
        parser.exit()


#: What ``sqlqueue --help`` says first (plain text: a terminal shows no markup).
DESCRIPTION = (
    "sqlqueue: create, inspect and migrate SQL queue tables, send and take messages, and run "
    "endpoints and the outbox dispatcher."
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sqlqueue``, with every group's commands."""
    parser = failures.ArgumentParser(prog="sqlqueue", description=DESCRIPTION)
    arguments.url_option(parser)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging, and the traceback of an error")
    parser.add_argument("--version", action=_VersionAction, dest=argparse.SUPPRESS,
                        help="show the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    _url_after_commands(parser)
    return parser


def _url_after_commands(parser: argparse.ArgumentParser) -> None:
    """Accept ``--url`` after every command too (``sqlqueue list-queues --url ...``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):  # aliases share a parser
                arguments.url_option(command, default=argparse.SUPPRESS)
                _url_after_commands(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sqlqueue``; return the exit status (2 for bad input, 1 for database errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.context = context.CommandContext.from_args(args)
    hints = failures.HintsOnThisDatabase(args.context)
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:  # log lines suggesting a command name this run's database too
        handler.addFilter(hints)
    try:
        return failures.run(args.func, args)
    finally:
        for handler in handlers:
            handler.removeFilter(hints)
        args.context.close()


__all__ = [
    "arguments",
    "build_parser",
    "ddl_dialect",
    "key_value",
    "main",
    "positive_int",
    "positive_seconds",
    "resolve_url",
]
