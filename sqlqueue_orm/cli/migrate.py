"""``sqlqueue migrate``: Alembic upgrades of queue and shared tables, from an installed package.

::

    sqlqueue --url postgresql+psycopg://... migrate                    # upgrade to head, online
    sqlqueue --url mssql+pyodbc://... migrate --sql --queues a,b > up.sql   # DBA script
    sqlqueue migrate --downgrade base                                  # back to the v1 layout

The Alembic Config is built in code on the scripts shipped inside the package, so no checkout and
no ``alembic.ini`` is needed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``migrate`` sub-command to the ``sqlqueue`` parser."""
    parser = subparsers.add_parser(
        "migrate",
        help="upgrade queue tables of any era and the shared tables (Alembic)",
        description=(
            "Bring every queue table (found by its columns) and the shared tables to the "
            "current schema, online, or print the script (--sql) for a DBA."
        ),
    )
    # One call per option on purpose, alike in shape: each states its own help.
    parser.add_argument(
        "--sql", action="store_true", help="print the script to stdout instead of running it"
    )
    parser.add_argument(
        "--revision",
        metavar="REV",
        help="upgrade to REV (default: head); with --sql, FROM:TO gives the script's range "
        "(default: from the database's revision)",
    )
    parser.add_argument(
        "--downgrade",
        metavar="REV",
        help="downgrade to REV instead (base: the v1 layout); with --sql, from --revision or "
        "else the database's revision",
    )
    parser.add_argument(
        "--schema",
        action="append",
        default=[],
        metavar="S",
        help="schema to find queue tables in (repeatable; default: the default schema)",
    )
    parser.add_argument(
        "--queues", metavar="A,B", help="only these queue tables (addresses, comma-separated)"
    )
    parser.add_argument(
        "--cluster-heaps",
        action="store_true",
        help="SQL Server: rebuild heap queue tables (the NServiceBus 8+ layout) with a clustered "
        "Index_RowVersion (default: a heap is kept, its index nonclustered)",
    )
    parser.set_defaults(func=_cmd_migrate)


def _cmd_migrate(args: argparse.Namespace) -> int:
    # Loaded only to migrate: the migration package registers its operations with Alembic.
    from sqlqueue_orm.migration import environment, runner

    for name in ("sqlqueue_orm.migration", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.INFO)
    config = environment.alembic_config(
        args.context.url,
        schemas=args.schema,
        queues=[args.queues] if args.queues else [],
        stdout=sys.stdout,
        cluster_heaps=args.cluster_heaps,
    )
    if args.downgrade is not None:
        revision = args.downgrade
        if args.sql and args.revision is not None and ":" not in revision:
            revision = f"{args.revision}:{revision}"
        runner.run(config, revision, downgrade=True, sql=args.sql)
    else:
        runner.run(config, args.revision or "head", sql=args.sql)
    return 0
