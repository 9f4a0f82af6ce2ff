"""``sqlqueue subscriptions [--json]``: who receives which event (the subscription table).

One line per subscription, by topic then endpoint: ``TOPIC<TAB>ENDPOINT<TAB>QUEUE_ADDRESS``, or
with ``--json`` one object a line (``topic``, ``endpoint``, ``queue_address``); none is ``no
subscriptions``, or ``[]`` with ``--json``. A table that does not exist is an error naming it (exit
status 1).
"""

from __future__ import annotations

import argparse
from typing import Any

from sqlqueue_orm import config
from sqlqueue_orm.cli import arguments, listings


def _cmd_subscriptions(args: argparse.Namespace) -> int:
    from sqlqueue_orm.pubsub.subscriptions import SubscriptionSettings, SubscriptionStore

    settings = SubscriptionSettings(table=args.table, schema=args.schema)
    store = SubscriptionStore(args.context.transport.engine, settings)
    listings.show(
        list(store.read_all()),
        as_json=args.json,
        record=lambda row: {
            "topic": row.topic, "endpoint": row.endpoint, "queue_address": row.queue_address
        },
        line=lambda row: "\t".join(
            map(listings.printable, (row.topic, row.endpoint, row.queue_address))
        ),
        none="no subscriptions",
    )
    return 0


def register(commands: Any) -> None:
    """Add ``subscriptions`` to the ``sqlqueue`` parser."""
    sub = commands.add_parser(
        "subscriptions", help="list the subscription table: topic, endpoint, queue address"
    )
    sub.add_argument("--json", action="store_true",
                     help="one JSON object a line: topic, endpoint, queue_address; [] for none")
    arguments.defaulted_option(sub, "--table", config.SUBSCRIPTION_TABLE,
                               "the subscription table", type=arguments.utf8_text)
    sub.add_argument("--schema", type=arguments.utf8_text, default=None,
                     help="its schema (default: the database's default schema)")
    sub.set_defaults(func=_cmd_subscriptions)
