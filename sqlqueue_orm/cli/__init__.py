"""The ``sqlqueue`` command line.

The database URL comes from ``--url``, else ``SQLQUEUE_URL``, else ``sqlite:///sqlqueue.db``; it
is resolved once into a :class:`~sqlqueue_orm.cli.context.CommandContext` (``args.context``) that
every sub-command gets, with one Transport made on first use. Where things are:

* ``arguments``: every argument type (numbers, TTBR, KEY=VALUE, files), validated one way;
* ``errors``: the one error policy (bad input exits 2, an unreachable database 1, one line each,
  a traceback only with ``--verbose``);
* ``queues``: create-queue, send, receive, browse, peek, purge-expired, purge-all, list-queues;
* ``ddl``: the DDL of queue tables for a DBA;
* ``verify``: drifts of the tables from their layout, with their repairs;
* feature areas add their own sub-commands with a ``register(subparsers)`` function
  (``migrate``, ``outbox``, ``run``, ``errors``, ``subscriptions``, ``spark``, ``dashboard``)
  and import only
  ``sqlqueue_orm.cli.arguments``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Sequence

from sqlqueue_orm.cli import arguments, context, ddl, errors, queues, verify
from sqlqueue_orm.cli.arguments import key_value, positive_int, positive_seconds, resolve_url
from sqlqueue_orm.cli.ddl import ddl_dialect

log = logging.getLogger("sqlqueue_orm.cli")

#: Modules that add sub-commands; each has ``register(subparsers)``.
EXTENSIONS = (
    "sqlqueue_orm.migration.commands",
    "sqlqueue_orm.sending.commands",
    "sqlqueue_orm.receiving.commands",
    "sqlqueue_orm.receiving.delayed_commands",
    "sqlqueue_orm.recoverability.commands",
    "sqlqueue_orm.pubsub.commands",
    "sqlqueue_orm.contrib.spark.commands",
    "sqlqueue_orm.contrib.dashboard.commands",
)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("sqlqueue_orm")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        import sqlqueue_orm

        return sqlqueue_orm.__version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sqlqueue``, with every extension's sub-commands."""
    parser = errors.ArgumentParser(prog="sqlqueue", description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url", help="database URL (default: $SQLQUEUE_URL, else sqlite:///sqlqueue.db)"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging, and the traceback of an error")
    parser.add_argument("--version", action="version", version=f"sqlqueue {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    queues.register(commands)
    ddl.register(commands)
    verify.register(commands)
    for module_name in EXTENSIONS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sqlqueue``; return the exit status (2 for bad input, 1 for database errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.context = context.CommandContext.from_args(args)
    try:
        return errors.run(args.func, args)
    finally:
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
