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

#: NServiceBus's PostgreSQL delayed table columns (unquoted, so lower case).
DELAYED_SIGNATURE = ("id", "headers", "body", "due")
# Delayed delivery after NServiceBus's PostgreSqlConstants (StoreDelayedMessageText,
# MoveDueDelayedMessageText): ``due`` is ``timestamptz(now() AT TIME ZONE 'UTC') + delay`` and
# matures when ``due < now() AT TIME ZONE 'UTC'``; the same expressions here (clock_timestamp:
# the time of the statement, not of a long transaction's start), so .NET's rows and ours mature
# alike whatever the session's TimeZone. The move skips rows another mover holds (.NET's waits
# for them) and gives each row its delayed id as its queue id, as .NET does.
_PG_DELAYED_NOW = "CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamptz)"
DELAYED_STORE = (
    "INSERT INTO {table} (headers, body, due) VALUES (:headers, :body, "
    f"{_PG_DELAYED_NOW} + CAST(:due_ms AS bigint) * interval '1 millisecond')"
)
DELAYED_MOVE = (
    "WITH message AS (DELETE FROM {table} WHERE id IN (SELECT id FROM {table} "
    f"WHERE due < {_PG_DELAYED_NOW} ORDER BY due LIMIT CAST(:n AS bigint) "
    "FOR UPDATE SKIP LOCKED) RETURNING id, headers, body, due) "
    "INSERT INTO {queue} (id, expires, headers, body) "
    "SELECT id, NULL, headers, body FROM message ORDER BY due"
)
DELAYED_NEXT_DUE = (
    f"SELECT EXTRACT(EPOCH FROM (due - {_PG_DELAYED_NOW})) FROM {{table}} ORDER BY due LIMIT 1"
)

#: Indexes of ``:table`` (a regclass): the predicate as ``pg_get_expr`` prints ``indpred``; the
#: INCLUDE columns are the key positions from ``indnkeyatts`` on (``indkey`` counts from 0).
INDEX_CATALOG = (
    "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid), 0, a.attname "
    "FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
    "LEFT JOIN pg_attribute AS a ON a.attrelid = i.indrelid "
    "AND a.attnum = ANY ((CAST(i.indkey AS int2[]))[i.indnkeyatts:]) "
    "WHERE i.indrelid = CAST(:table AS regclass)"
)

#: A queue table only ever has rows inserted and deleted, so its dead tuples are its churn:
#: vacuum it after a fixed number of them (not 20% of a backlog that may be millions), without
#: throttling, and fill its pages (no updates, so no room is kept for HOT). Measured in
#: docs/scale.md: with a 50,000-message backlog churned at ~1,600 receives/s, dead tuples
#: averaged 912 instead of 4,641.
QUEUE_STORAGE = (
    ("fillfactor", "100"),
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "1000"),
    ("autovacuum_vacuum_cost_delay", "0"),
)
STORAGE_CATALOG = "SELECT unnest(reloptions) FROM pg_class WHERE oid = CAST(:table AS regclass)"
STORAGE_DDL = "ALTER TABLE {table} SET ({settings})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostgresqlSupport(base.DialectSupport):
    """PostgreSQL: everything in the fields, and its own catalog query."""

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """PostgreSQL's dialect (*target_version* is for SQL Server only)."""
        return postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]


SUPPORT = PostgresqlSupport(
    delayed_signature=DELAYED_SIGNATURE,
    delayed_store=DELAYED_STORE,
    delayed_move=(DELAYED_MOVE,),
    delayed_next_due=DELAYED_NEXT_DUE,
    name="postgresql",
    index_catalog=INDEX_CATALOG,
    queue_storage=QUEUE_STORAGE,
    storage_catalog=STORAGE_CATALOG,
    storage_ddl=STORAGE_DDL,
    listen_notify=True,
    peek_counts_held_rows=True,
    slot_claims="grouped",
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
