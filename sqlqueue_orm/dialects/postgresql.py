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

_PG_NOW = "timezone('UTC', clock_timestamp())"
# NServiceBus's PostgreSQL layout: unquoted lower-case columns id, expires, headers, body, seq
# (NServiceBus.Transport.PostgreSql PostgreSqlConstants, see models/queue_table.py).
# Headers are read as text: in a UTF8 database every text value is valid UTF-8 (the server
# refuses anything else on the way in), so psycopg cannot fail decoding one. A SQL_ASCII database
# would make psycopg return bytes, but SQLAlchemy's psycopg dialect cannot run on one at all.
_PG_RETURNING = (
    f"RETURNING id, seq, (expires IS NOT NULL AND expires <= {_PG_NOW}) AS expired, headers, body"
)
_PG_EXPIRES = (
    f"CASE WHEN CAST(:ttbr AS bigint) IS NULL THEN NULL "
    f"ELSE {_PG_NOW} + CAST(:ttbr AS bigint) * interval '1 millisecond' END"
)
# Advisory-lock claim: a bounded window of the oldest rows, keyed by (table oid, seq).
_PG_ADVISORY = (
    "SELECT c.seq FROM (SELECT seq, tableoid FROM {table} {where}"
    "ORDER BY seq LIMIT CAST(:window AS bigint)) AS c "
    "WHERE pg_try_advisory_xact_lock(CAST(c.tableoid AS integer), "
    "CAST(c.seq % 2147483648 AS integer)) LIMIT CAST(:n AS bigint)"
)
# The layout has no Recoverable column: both send variants are the .NET transport's column list.
# id is the primary key there: a message sent again while it is still queued (an outbox dispatch
# retried after a crash) is absorbed, not an error that would block the dispatch forever.
_PG_SEND = (
    "INSERT INTO {table} (id, expires, headers, body) "
    f"VALUES (:id, {_PG_EXPIRES}, :headers, :body) ON CONFLICT (id) DO NOTHING"
)

# The floor (queuing/floor.py): the index scan on seq starts at :floor instead of the first
# entry. Behind a long-held snapshot every received row leaves a dead index entry that vacuum
# may not remove, and an unbounded scan walks all of them before the first live row (268 ms a
# receive at 1,000,000). A bound parameter, not a literal: one prepared statement, one plan.
_PG_FLOOR = "seq >= CAST(:floor AS bigint)"

#: The hot path (NServiceBus's PostgreSqlConstants: send, receive, peek, purge).
HOT_PATH = base.SqlText(
    send=_PG_SEND,
    send_without_recoverable=_PG_SEND,
    send_skips_duplicates=True,
    required_columns=("id", "expires", "headers", "body", "seq"),
    # = ANY(ARRAY(...)) runs the claim once, as an InitPlan, before the delete.
    receive=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        "SELECT seq FROM {table} ORDER BY seq LIMIT CAST(:n AS bigint) "
        f"FOR UPDATE SKIP LOCKED)) {_PG_RETURNING}"
    ),
    peek="SELECT COALESCE(MAX(seq) - MIN(seq) + 1, 0) FROM {table}",
    receive_from_floor=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        f"SELECT seq FROM {{table}} WHERE {_PG_FLOOR} ORDER BY seq LIMIT CAST(:n AS bigint) "
        f"FOR UPDATE SKIP LOCKED)) {_PG_RETURNING}"
    ),
    # MIN and MAX each become an index probe with the bound (the min/max optimisation keeps
    # the WHERE): MIN starts at the floor, MAX at the tail as before.
    peek_from_floor=f"SELECT COALESCE(MAX(seq) - MIN(seq) + 1, 0) FROM {{table}} WHERE {_PG_FLOOR}",
    purge_expired=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        f"SELECT seq FROM {{table}} WHERE expires < {_PG_NOW} "
        "ORDER BY seq LIMIT CAST(:n AS bigint) FOR UPDATE SKIP LOCKED))"
    ),
    purge_all="DELETE FROM {table}",
    # id is the primary key; SKIP LOCKED: a row another retry or delete holds is not taken.
    receive_by_id=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        "SELECT seq FROM {table} WHERE id = CAST(:id AS uuid) FOR UPDATE SKIP LOCKED)) "
        f"{_PG_RETURNING}"
    ),
    receive_without_row_locks=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        + _PG_ADVISORY.replace("{where}", "")
        + f")) {_PG_RETURNING}"
    ),
    receive_without_row_locks_from_floor=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        + _PG_ADVISORY.replace("{where}", f"WHERE {_PG_FLOOR} ")
        + f")) {_PG_RETURNING}"
    ),
    purge_expired_without_row_locks=(
        "DELETE FROM {table} WHERE seq = ANY(ARRAY("
        + _PG_ADVISORY.replace("{where}", f"WHERE expires < {_PG_NOW} ")
        + "))"
    ),
    # FOR UPDATE needs UPDATE privilege; a role without it claims rows by advisory lock.
    update_privilege="SELECT has_any_column_privilege(CAST(:t AS regclass), 'UPDATE')",
    id_to_driver=lambda value: value,
)


# -- wake-up by LISTEN/NOTIFY (sqlqueue_orm.receiving.wakeup) ---------------------------------
_CHANNEL = "sqlqueue_wakeup"
_TRIGGER = "sqlqueue_wakeup"
_FUNCTION = "sqlqueue_wakeup_notify"
_NOTIFY_CALL = f"pg_notify('{_CHANNEL}', TG_TABLE_NAME)"

#: A statement-level ``AFTER INSERT`` trigger on each queue table notifies one channel with the
#: table's name: every writer's sends (.NET endpoints included) wake the endpoints listening.
#: The payload is the table name only: a wake-up is a hint, and a spurious one costs one peek.
NOTIFY_WAKEUP = base.NotifyWakeup(
    channel=_CHANNEL,
    trigger=_TRIGGER,
    function=_FUNCTION,
    notify_call=_NOTIFY_CALL,
    create_function=f"""
CREATE OR REPLACE FUNCTION {_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {_NOTIFY_CALL};
    RETURN NULL;
END
$$""",
    # CREATE OR REPLACE FUNCTION races on pg_proc: installers take turns.
    install_lock="SELECT pg_advisory_xact_lock(hashtext(:key))",
    drop_trigger=f"DROP TRIGGER IF EXISTS {_TRIGGER} ON {{table}}",
    create_trigger=(
        f"CREATE TRIGGER {_TRIGGER} AFTER INSERT ON {{table}} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {_FUNCTION}()"
    ),
    listen=f"LISTEN {_CHANNEL}",
    trigger_catalog=(
        "SELECT pg_get_triggerdef(t.oid), p.prosrc FROM pg_trigger AS t "
        "JOIN pg_proc AS p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = CAST(:table AS regclass) AND t.tgname = :trigger"
    ),
)

# -- one Spark ingester per queue, and its stream's offsets ------------------------------------
#: Session advisory locks on a 64-bit hash of the resource name.
SESSION_LOCK = base.SessionLock(
    acquire="SELECT pg_try_advisory_lock(hashtextextended(:resource, 0))",
    release="SELECT pg_advisory_unlock(hashtextextended(:resource, 0))",
    granted=lambda status: status is True,
)

#: A seq seen becomes the stream's end offset once every transaction in progress when it was seen
#: (the ``xip`` of a ``pg_current_snapshot()`` taken after it) has ended (``pg_xact_status``).
STREAM_FENCE = base.StreamFence(
    kind=base.FenceKind.SNAPSHOT,
    snapshot="SELECT CAST(pg_current_snapshot() AS text)",
    in_progress=(
        "SELECT count(*) FROM pg_snapshot_xip(CAST(:snapshot AS pg_snapshot)) AS x(xid) "
        "WHERE pg_xact_status(x.xid) = 'in progress'"
    ),
)

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
    hot_path=HOT_PATH,
    notify_wakeup=NOTIFY_WAKEUP,
    session_lock=SESSION_LOCK,
    stream_fence=STREAM_FENCE,
    delayed_signature=DELAYED_SIGNATURE,
    delayed_store=DELAYED_STORE,
    delayed_move=(DELAYED_MOVE,),
    delayed_next_due=DELAYED_NEXT_DUE,
    name="postgresql",
    index_catalog=INDEX_CATALOG,
    queue_storage=QUEUE_STORAGE,
    storage_catalog=STORAGE_CATALOG,
    storage_ddl=STORAGE_DDL,
    peek_counts_held_rows=True,
    slot_claims=base.SlotClaims.GROUPED,
    identifier_limit=IDENTIFIER_LIMIT,
    identifier_unit="bytes",
    creates_schemas=True,
    address_form=base.AddressForm.SCHEMA_QUALIFIED,
    queue_layout=base.QueueLayout.SEQ,
    queue_signature=QUEUE_SIGNATURE,
    # NServiceBus's PostgreSqlConstants.AddMessageBodyStringColumn: BodyString unquoted.
    body_string_column="bodystring",
    body_string_ddl=(
        "ALTER TABLE {{table}} ADD COLUMN bodystring TEXT GENERATED ALWAYS AS "
        "({expression}) STORED"
    ),
    # Transaction-scoped: an installer that fails releases it with its rollback.
    install_lock="SELECT pg_advisory_xact_lock(hashtextextended(:resource, 0))",
    missing_table_markers=("42p01", "undefinedtable"),
    missing_column_markers=("42703",),
    transient_markers=(*base.GENERIC_TRANSIENT, "40p01"),  # 40P01: deadlock detected
    # NServiceBus's CreateSubscriptionTableText writes them unquoted: lower case.
    subscription_columns=("queueaddress", "endpoint", "topic"),
)
