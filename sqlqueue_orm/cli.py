"""The ``sqlqueue`` command line.

The database URL comes from ``--url``, else ``SQLQUEUE_URL``, else ``sqlite:///sqlqueue.db``.
Feature areas add their own sub-commands through a ``register(subparsers)`` function
(``migrate``, ``outbox``, ``spark``), so this module stays small.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence

from sqlalchemy.dialects import mssql, postgresql, sqlite
from sqlalchemy.engine import Dialect

from sqlqueue_orm import db, exceptions
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.config import QueueSettings
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.models.queue_table import SQL_SERVER_LAYOUTS
from sqlqueue_orm.schema import QueueInstaller
from sqlqueue_orm.transport import Transport

log = logging.getLogger("sqlqueue_orm.cli")

#: Modules that add sub-commands; each has ``register(subparsers)``.
EXTENSIONS = (
    "sqlqueue_orm.migration.commands",
    "sqlqueue_orm.sending.commands",
    "sqlqueue_orm.contrib.spark.commands",
)


def resolve_url(args: argparse.Namespace) -> str:
    """``--url``, else ``SQLQUEUE_URL``, else the embedded SQLite default."""
    return str(args.url or os.environ.get("SQLQUEUE_URL") or db.DEFAULT_URL)


def key_value(text: str) -> tuple[str, str]:
    """Argument type ``KEY=VALUE`` (the value may hold ``=``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def positive_int(text: str) -> int:
    """Argument type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    """Argument type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def _cmd_create_queue(args: argparse.Namespace) -> int:
    with Transport(resolve_url(args), sql_server_layout=args.sql_server_layout) as transport:
        for name in args.names:
            created = transport.create_queue(name, body_string=args.body_string)
            print(f"{'created' if created else 'exists '} {name}")
    return 0


def _cmd_send(args: argparse.Namespace) -> int:
    message = OutgoingMessage(
        body=args.body.encode("utf-8"),
        headers=dict(args.header or []),
        message_id=args.message_id,
        time_to_be_received=args.ttbr,
    )
    with Transport(resolve_url(args)) as transport:
        print(transport.send(args.queue, message))
    return 0


def _cmd_receive(args: argparse.Namespace) -> int:
    with Transport(resolve_url(args)) as transport:
        messages = transport.receive(args.queue, max_messages=args.count)
    for message in messages:
        if args.json:
            record: dict[str, object] = {
                "id": str(message.id),
                "message_id": message.message_id,
                "headers": message.headers
                if message.headers_error is None
                else message.raw_headers,
                "body": message.text,
                "expired": message.expired,
            }
            if message.headers_error is not None:
                record["headers_error"] = message.headers_error
                if isinstance(message.raw_headers, bytes):  # not UTF-8: JSON cannot hold them
                    record["headers"] = None
                    record["headers_base64"] = base64.b64encode(message.raw_headers).decode()
            print(json.dumps(record, ensure_ascii=False))
        else:
            state = " (expired)" if message.expired else ""
            print(f"{message.message_id}{state}: {message.text}")
    return 0


def _cmd_peek(args: argparse.Namespace) -> int:
    with Transport(resolve_url(args)) as transport:
        print(transport.peek(args.queue))
    return 0


def _cmd_purge_expired(args: argparse.Namespace) -> int:
    with Transport(resolve_url(args)) as transport:
        print(transport.purge_expired(args.queue, batch_size=args.batch))
    return 0


def _cmd_list_queues(args: argparse.Namespace) -> int:
    with Transport(resolve_url(args)) as transport:
        for name, count in transport.list_queues(args.schema or None):
            print(f"{name}\t{count}")
    return 0


def ddl_dialect(name: str, target_version: int | None = None) -> Dialect:
    """A dialect for printing DDL: named paramstyle, so nothing in a name is %-doubled."""
    if name == "mssql":
        dialect: Dialect = mssql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]
        if target_version is not None:
            # SQL Server 2019 is major version 15, 2017 is 14, 2016 is 13.
            major = {2016: 13, 2017: 14, 2019: 15, 2022: 16}.get(target_version, 16)
            dialect.server_version_info = (major,)
        return dialect
    if name == "postgresql":
        return postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]
    return sqlite.dialect(paramstyle="named")


def _cmd_ddl(args: argparse.Namespace) -> int:
    dialect = ddl_dialect(args.dialect, args.target_version)
    installer = QueueInstaller(QueueSettings(sql_server_layout=args.sql_server_layout))
    separator = "\nGO\n" if args.dialect == "mssql" else ";\n"
    for name in args.names:
        address = QueueAddress.parse(name, args.dialect)
        address.check_for(args.dialect)
        print(f"-- queue {address}")
        statements = installer.ddl(address, dialect, body_string=args.body_string)
        print(separator.join(statements) + separator)
    return 0


def _layout_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sql-server-layout",
        choices=SQL_SERVER_LAYOUTS,
        default="clustered",
        help="SQL Server: clustered Index_RowVersion (default), or heap: the NServiceBus 8+ "
        "layout for tables shared with .NET endpoints",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sqlqueue``, with every extension's sub-commands."""
    parser = argparse.ArgumentParser(prog="sqlqueue", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", help="database URL (default: $SQLQUEUE_URL, else sqlite:///sqlqueue.db)"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub = commands.add_parser("create-queue", help="create queue tables (idempotent)")
    sub.add_argument("names", nargs="+", metavar="NAME")
    sub.add_argument("--body-string", action="store_true", help="add the BodyString column")
    _layout_argument(sub)
    sub.set_defaults(func=_cmd_create_queue)

    sub = commands.add_parser("send", help="send one message")
    sub.add_argument("queue")
    sub.add_argument("--body", required=True, help="the body, as UTF-8 text")
    sub.add_argument("--header", action="append", type=key_value, metavar="K=V")
    sub.add_argument("--ttbr", type=positive_seconds, metavar="SECONDS", help="time to be received")
    sub.add_argument("--message-id", help="NServiceBus.MessageId (default: a new GUID)")
    sub.set_defaults(func=_cmd_send)

    sub = commands.add_parser("receive", help="take messages off a queue")
    sub.add_argument("queue")
    sub.add_argument("--count", type=positive_int, default=1, metavar="N")
    sub.add_argument("--json", action="store_true", help="one JSON object a line")
    sub.set_defaults(func=_cmd_receive)

    sub = commands.add_parser("peek", help="estimated message count")
    sub.add_argument("queue")
    sub.set_defaults(func=_cmd_peek)

    sub = commands.add_parser("purge-expired", help="delete expired messages in batches")
    sub.add_argument("queue")
    sub.add_argument("--batch", type=positive_int, default=10_000, metavar="N")
    sub.set_defaults(func=_cmd_purge_expired)

    sub = commands.add_parser("list-queues", help="queue tables with estimated counts")
    sub.add_argument("--schema", action="append", help="schema to look in (repeatable)")
    sub.set_defaults(func=_cmd_list_queues)

    sub = commands.add_parser("ddl", help="print the DDL of queue tables for a DBA")
    sub.add_argument("--dialect", required=True, choices=("mssql", "postgresql", "sqlite"))
    sub.add_argument(
        "--target-version",
        type=int,
        default=None,
        metavar="YEAR",
        help="SQL Server version (2016, 2017, 2019, 2022); default: 2019 or later",
    )
    sub.add_argument("--body-string", action="store_true")
    _layout_argument(sub)
    sub.add_argument("names", nargs="+", metavar="NAME")
    sub.set_defaults(func=_cmd_ddl)

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
    """Run ``sqlqueue``; return the exit code (2 for bad input, 1 for database errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except exceptions.ConfigurationError as error:
        print(f"sqlqueue: error: {error}", file=sys.stderr)
        return 2
    except exceptions.SqlQueueError as error:
        print(f"sqlqueue: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
