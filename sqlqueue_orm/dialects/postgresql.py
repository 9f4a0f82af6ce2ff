"""PostgreSQL: NServiceBus's PostgreSQL layout, advisory locks, ``FOR UPDATE SKIP LOCKED``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sqlalchemy.dialects import postgresql

from sqlqueue_orm.dialects import base

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

#: PostgreSQL's identifier limit in bytes (NAMEDATALEN - 1); longer names are cut silently.
IDENTIFIER_LIMIT = 63

#: NServiceBus's PostgreSQL queue columns that make a table a queue table (unquoted, so lower
#: case; ``seq`` the order), in table order.
QUEUE_SIGNATURE = ("id", "expires", "headers", "body", "seq")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostgresqlSupport(base.DialectSupport):
    """PostgreSQL: everything in the fields, and its own catalog query."""

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """PostgreSQL's dialect (*target_version* is for SQL Server only)."""
        return postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]


SUPPORT = PostgresqlSupport(
    name="postgresql",
    listen_notify=True,
    identifier_limit=IDENTIFIER_LIMIT,
    identifier_unit="bytes",
    creates_schemas=True,
    address_form="postgresql",
    queue_layout="postgresql",
    queue_signature=QUEUE_SIGNATURE,
    # NServiceBus's PostgreSqlConstants.AddMessageBodyStringColumn: BodyString unquoted.
    body_string_column="bodystring",
    body_string_ddl=(
        "ALTER TABLE {{table}} ADD COLUMN bodystring TEXT GENERATED ALWAYS AS "
        "({expression}) STORED"
    ),
    # Transaction-scoped: an installer that fails releases it with its rollback.
    install_lock="SELECT pg_advisory_xact_lock(hashtextextended(:resource, 0))",
    # Session advisory locks on a 64-bit hash of the resource name.
    session_lock_acquire="SELECT pg_try_advisory_lock(hashtextextended(:resource, 0))",
    session_lock_release="SELECT pg_advisory_unlock(hashtextextended(:resource, 0))",
    missing_table_markers=("42p01", "undefinedtable"),
    missing_column_markers=("42703",),
    transient_markers=(*base.GENERIC_TRANSIENT, "40p01"),  # 40P01: deadlock detected
    # NServiceBus's CreateSubscriptionTableText writes them unquoted: lower case.
    subscription_columns=("queueaddress", "endpoint", "topic"),
)
