"""``sqlqueue delayed list [--json] [--endpoint E]``: the delayed messages waiting, earliest first.

One line per message: ``DUE  DESTINATION  MESSAGE_ID  TABLE`` (due in UTC, ISO 8601), or with
``--json`` one object per line with the headers and the body (``body`` when it is UTF-8 text, else
``body_base64``); none waiting is ``no delayed messages``, or ``[]`` with ``--json``. Without
``--endpoint`` every delayed table (``*.Delayed`` with the delayed columns) of the default schema,
or of the ``--schema`` given, is read.
"""

from __future__ import annotations

import argparse
import base64
import logging
from typing import Any

from sqlqueue_orm.cli import arguments, listings

# The name these lines are logged under (log settings naming it keep applying).
log = logging.getLogger("sqlqueue_orm.receiving.delayed_commands")


def register(subparsers: Any) -> None:
    """Add ``delayed list`` to the ``sqlqueue`` command line."""
    delayed = subparsers.add_parser("delayed", help="native delayed delivery")
    commands = delayed.add_subparsers(dest="delayed_command", required=True, metavar="COMMAND")
    sub = commands.add_parser("list", help="delayed messages waiting, earliest due first")
    sub.add_argument("--endpoint", type=arguments.utf8_text, metavar="E",
                     help="only the delayed table of endpoint E")
    sub.add_argument("--schema", action="append", type=arguments.utf8_text,
                     help="schema to look in (repeatable; default: the default schema)")
    sub.add_argument("--json", action="store_true", help="one JSON object per line; [] for none")
    arguments.defaulted_option(sub, "--count", 1_000, "show at most N messages",
                               type=arguments.bounded_int(1, 1_000_000), metavar="N")
    sub.set_defaults(func=_cmd_list)


def _record(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "table": message.table,
        "due": message.due.isoformat(),
        "destination": message.destination,
        "message_id": message.message_id,
        "headers": message.headers,
    }
    body = message.body or b""
    try:
        result["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        result["body_base64"] = base64.b64encode(body).decode("ascii")
    return result


def _cmd_list(args: argparse.Namespace) -> int:
    transport = args.context.transport
    messages = transport.browse_delayed(args.endpoint, args.schema, args.count)
    listings.show(
        messages,
        as_json=args.json,
        record=_record,
        line=lambda message: "\t".join(
            map(listings.printable, (message.due.isoformat(), message.destination,
                                     message.message_id, message.table))
        ),
        none="no delayed messages",
    )
    log.info("%d delayed message(s)", len(messages))
    return 0
