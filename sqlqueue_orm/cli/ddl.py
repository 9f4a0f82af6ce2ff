"""``sqlqueue ddl``: print the DDL of queue tables for a DBA (no database needed)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import config
from sqlqueue_orm.cli import arguments
from sqlqueue_orm.config import QueueSettings

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

    from sqlqueue_orm import dialects

#: ``--target-version`` years and the SQL Server major version of each.
SQL_SERVER_MAJOR = config.SQL_SERVER_MAJOR


def ddl_dialect(name: str, target_version: int | None = None) -> Dialect:
    """A dialect for printing DDL: named paramstyle, so nothing in a name is %-doubled."""
    return _support(name).ddl_dialect(target_version)


def _support(name: str) -> dialects.DialectSupport:
    from sqlqueue_orm import dialects

    # --dialect is one of the three (argparse choices); anything else prints SQLite's DDL.
    return dialects.ALL.get(name, dialects.sqlite.SUPPORT)


def _cmd_ddl(args: argparse.Namespace) -> int:
    from sqlqueue_orm.addressing import QueueAddress
    from sqlqueue_orm.schema import QueueInstaller

    dialect = ddl_dialect(args.dialect, args.target_version)
    installer = QueueInstaller(QueueSettings(sql_server_layout=args.sql_server_layout))
    separator = _support(args.dialect).script_separator
    for name in args.names:
        address = QueueAddress.parse(name, args.dialect)
        address.check_for(args.dialect)
        print(f"-- queue {address}")
        statements = installer.ddl(address, dialect, body_string=args.body_string)
        print(separator.join(statements) + separator)
    return 0


def register(commands: Any) -> None:
    """Add ``ddl`` to the ``sqlqueue`` parser."""
    sub = commands.add_parser("ddl", help="print the DDL of queue tables for a DBA")
    sub.add_argument("--dialect", required=True, choices=sorted(config.DIALECT_NAMES))
    sub.add_argument(
        "--target-version",
        type=int,
        choices=sorted(SQL_SERVER_MAJOR),
        default=None,
        metavar="YEAR",
        help="SQL Server version (2016, 2017, 2019, 2022); default: 2019 or later",
    )
    sub.add_argument("--body-string", action="store_true")
    arguments.sql_server_layout(sub)
    sub.add_argument("names", nargs="+", metavar="NAME")
    sub.set_defaults(func=_cmd_ddl)
