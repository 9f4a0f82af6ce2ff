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
    parser.add_argument(
        "--sql", action="store_true", help="print the script to stdout instead of running it"
    )
    parser.add_argument(
        "--revision", default="head", metavar="REV", help="upgrade to REV (default: head)"
    )
    parser.add_argument(
        "--downgrade", metavar="REV", help="downgrade to REV instead (base: the v1 layout)"
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
    parser.set_defaults(func=_cmd_migrate)


def _cmd_migrate(args: argparse.Namespace) -> int:
    from alembic import command
    from alembic.util import CommandError
    from sqlalchemy import exc

    from sqlqueue_orm import exceptions
    from sqlqueue_orm.migration.environment import alembic_config

    for name in ("sqlqueue_orm.migration", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.INFO)
    config = alembic_config(
        args.context.url,
        schemas=args.schema,
        queues=[args.queues] if args.queues else [],
        stdout=sys.stdout,
    )
    try:
        if args.downgrade is not None:
            revision = args.downgrade
            if args.sql and ":" not in revision:
                revision = f"{args.revision}:{revision}"  # offline downgrades need a range
            command.downgrade(config, revision, sql=args.sql)
        else:
            command.upgrade(config, args.revision, sql=args.sql)
    except CommandError as error:
        raise exceptions.ConfigurationError(f"migrate: {error}") from error
    except exc.DBAPIError as error:
        raise exceptions.DatabaseError(f"migrate: {error.orig}") from error
    return 0
