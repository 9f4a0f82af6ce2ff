"""``sqlqueue verify``: compare this package's tables with their dialect's layout.

Prints each drift and the statements that repair it (``--json``: one JSON object a line, ``[]``
when nothing drifted), then exits 1 if anything drifted and 0 if nothing did; a schema that does
not exist is bad input (exit 2). The comparison is :func:`sqlqueue_orm.verify.verify`.
"""

from __future__ import annotations

import argparse
from typing import Any

from sqlqueue_orm.cli import arguments, listings


def _cmd_verify(args: argparse.Namespace) -> int:
    from sqlqueue_orm import db, dialects
    from sqlqueue_orm import verify as verification

    transport = args.context.transport
    schemas = tuple(args.schema) or (None,)
    with db.reading(transport.engine) as connection:  # no write lock: writers go on
        drifts = verification.verify(
            connection,
            schemas,
            wakeup_queues=args.wakeup or (),
            sql_server_layout=args.sql_server_layout,
        )
        separator = dialects.for_dialect(connection).script_separator
    if args.json:
        listings.show(
            drifts, as_json=True, record=lambda drift: drift.as_dict(), line=str, none=""
        )
    else:
        for drift in drifts:
            print(f"-- {drift.describe()}")
            print(separator.join(drift.repair) + separator)
        if not drifts:
            print(f"verified: no drift on the {args.context.where}")
    return 1 if drifts else 0


def register(commands: Any) -> None:
    """Add ``verify`` to the ``sqlqueue`` parser."""
    sub = commands.add_parser(
        "verify", help="compare queue, delayed, subscription and outbox tables with the layout"
    )
    sub.add_argument("--json", action="store_true", help="one JSON object a drift; [] for none")
    sub.add_argument("--schema", action="append", type=arguments.utf8_text, default=[],
                     metavar="S", help="schema to look in (repeatable; default: the default one)")
    sub.add_argument("--wakeup", action="append", type=arguments.utf8_text, metavar="QUEUE",
                     help="PostgreSQL: a queue table that must have the NOTIFY wake-up trigger")
    sub.add_argument(
        "--sql-server-layout",
        choices=("clustered", "heap"),
        default=None,
        help="SQL Server: the layout queue tables must have (default: the one each has)",
    )
    sub.set_defaults(func=_cmd_verify)
