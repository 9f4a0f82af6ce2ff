"""PostgreSQL: NServiceBus's PostgreSQL layout, advisory locks, ``FOR UPDATE SKIP LOCKED``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sqlqueue_orm.dialects import base, control, flow, statements

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Dialect

#: PostgreSQL's identifier limit in bytes (NAMEDATALEN - 1); longer names are cut silently.
IDENTIFIER_LIMIT: int = base.POSTGRESQL_IDENTIFIER_LIMIT

#: NServiceBus's PostgreSQL queue columns that make a table a queue table.
QUEUE_SIGNATURE: tuple[str, ...] = base.POSTGRESQL_SIGNATURE

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
# may not remove, and an unbounded scan walks all of them before the first live row, a cost that
# grows with the backlog received behind the snapshot. A bound parameter, not a literal: one
# prepared statement, one plan.
_PG_FLOOR = "seq >= CAST(:floor AS bigint)"

#: The hot path (NServiceBus's PostgreSqlConstants: send, receive, peek, purge).
HOT_PATH = statements.SqlText(
    expired_read=f"({{expires}} IS NOT NULL AND {{expires}} <= {_PG_NOW})",
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
#: The trigger fires only while an idle endpoint is registered as waiting: a waiter holds a
#: session-level exclusive advisory lock on the queue's waiting slot (two-int keys, a key space
#: apart from the bigint locks used elsewhere), and the trigger's ``WHEN`` tries a shared
#: transaction-level lock on it. Senders' shared locks never conflict with each other; a failed
#: try means a waiter holds the slot, so the sender notifies (at its commit). The check runs in
#: ``WHEN``: with nobody waiting no PL/pgSQL runs at all. One slot: every idle endpoint
#: listens and a notification wakes them all, so one registration is enough, and any
#: non-constant ``WHEN`` costs each sending statement a few microseconds, a second lock try
#: as much again (``scripts/wakeup_trigger_cost.py``).
NOTIFY_WAKEUP = statements.NotifyWakeup(
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
        f"FOR EACH STATEMENT WHEN (NOT ({{when}})) EXECUTE FUNCTION {_FUNCTION}()"
    ),
    slot_check="pg_try_advisory_xact_lock_shared({slot}, {table_key})",
    slot_join=" AND ",
    register="pg_try_advisory_lock({slot}, {table_key})",
    unregister="SELECT pg_advisory_unlock({slot}, {table_key})",
    # "SQ" in the high bytes: the first slot's key; the slots follow it.
    slot_namespace=0x5351_0000,
    slots=1,
    listen=f"LISTEN {_CHANNEL}",
    trigger_catalog=(
        "SELECT pg_get_triggerdef(t.oid), p.prosrc FROM pg_trigger AS t "
        "JOIN pg_proc AS p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = CAST(:table AS regclass) AND t.tgname = :trigger"
    ),
    table_identity=(
        "SELECT n.nspname, c.relname FROM pg_class AS c "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE c.oid = CAST(:table AS regclass)"
    ),
    backend_pid="SELECT pg_backend_pid()",
    # (42501: not the table's owner, or no CREATE on the schema for the function)
    cannot_create_markers=("InsufficientPrivilege", "must be owner", "permission denied"),
)

# -- one Spark ingester per queue, and its stream's offsets ------------------------------------
#: Session advisory locks on a 64-bit hash of the resource name.
SESSION_LOCK = statements.SessionLock(
    acquire="SELECT pg_try_advisory_lock(hashtextextended(:resource, 0))",
    release="SELECT pg_advisory_unlock(hashtextextended(:resource, 0))",
    granted=lambda status: status is True,
)

#: A seq seen becomes the stream's end offset once every transaction in progress when it was seen
#: (the ``xip`` of a ``pg_current_snapshot()`` taken after it) has ended (``pg_xact_status``).
STREAM_FENCE = statements.StreamFence(
    kind=statements.FenceKind.SNAPSHOT,
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


#: libpq's parameters bounding every wait on the network (``connect_args`` and the URL's query
#: override each): a connection attempt gives up after ``connect_timeout`` seconds; an idle
#: connection is probed after ``keepalives_idle`` seconds without traffic, every
#: ``keepalives_interval`` seconds, and dropped after ``keepalives_count`` probes unanswered (a
#: LISTEN waiting for a notification, a pooled connection); data sent and not acknowledged for
#: ``tcp_user_timeout`` milliseconds drops the connection (a statement sent into a dead link).
#: None of them limits a statement the server is busy with: the server acknowledges its bytes.
CONNECT_DEFAULTS: tuple[tuple[str, object], ...] = (
    ("connect_timeout", 5),
    ("keepalives", 1),
    ("keepalives_idle", 5),
    ("keepalives_interval", 2),
    ("keepalives_count", 3),
    ("tcp_user_timeout", 10_000),
)
#: libpq's ``PQTRANS_ACTIVE``: a statement was sent and its result has not fully arrived.
_ACTIVE = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostgresqlSupport(base.DialectSupport):
    """PostgreSQL: everything in the fields, and its own catalog query."""

    def sync_engine_url(self, url: sa.URL) -> sa.URL:
        """*url* for psycopg; an asyncpg URL's own arguments translated for libpq.

        asyncpg's ``ssl`` (a TLS mode) is libpq's ``sslmode``; SQLAlchemy's asyncpg dialect's
        ``prepared_statement_cache_size`` is dropped (psycopg prepares statements by itself).
        libpq refuses a connection with either, and asyncpg takes no other argument from the
        URL that libpq lacks (its numbers must be ``connect_args``, not URL text).
        """
        synchronous = super().sync_engine_url(url)
        if url.get_driver_name() != "asyncpg":
            return synchronous
        query = dict(synchronous.query)
        query.pop("prepared_statement_cache_size", None)
        ssl = query.pop("ssl", None)
        if ssl is not None:
            query.setdefault("sslmode", ssl)
        return synchronous.set(query=query)

    def reserved_name(self, table: str, schema: str | None) -> str | None:
        """PostgreSQL's catalog: schemas ``pg_*`` and ``information_schema``, and ``pg_*`` tables.

        A table named without a schema is looked up in ``pg_catalog`` before the search path,
        so an unqualified ``pg_*`` name may be (or become) a system catalog.
        """
        if schema is not None and (schema.startswith("pg_") or schema == "information_schema"):
            return f"schema {schema!r} is PostgreSQL's own"
        if schema is None and table.startswith("pg_"):
            return "PostgreSQL reserves table names beginning with pg_ outside a named schema"
        return None

    def ddl_dialect(self, target_version: int | None = None) -> Dialect:
        """PostgreSQL's dialect (*target_version* is for SQL Server only)."""
        # Imported on first use: a process on another database never needs it.
        from sqlalchemy.dialects import postgresql

        return postgresql.dialect(paramstyle="named")  # type: ignore[no-untyped-call]

    def statement_waiting(self, dbapi_connection: Any) -> bool:
        """Whether psycopg's connection waits on a statement (libpq's ``PQTRANS_ACTIVE``)."""
        pgconn = getattr(dbapi_connection, "pgconn", None)
        try:
            return pgconn is not None and pgconn.transaction_status == _ACTIVE
        except Exception:  # closed meanwhile
            return False

    def socket_of(self, dbapi_connection: Any) -> int | None:
        """The socket of psycopg's connection (libpq's)."""
        pgconn = getattr(dbapi_connection, "pgconn", None)
        try:
            return None if pgconn is None else int(pgconn.socket)
        except Exception:  # closed meanwhile
            return None


# -- flow control (sqlqueue_orm.receiving.flow): advisory locks ------------------------------
# A slot is a transaction-scoped advisory lock ``(hashtext(<lock name>), <slot>)``; a lease is
# the same lock taken for the session. Every statement tries ``:first`` first, then the next
# slots modulo the limit, so each worker of a process prefers a slot of its own.
_FIRST = "CAST(:first AS integer)"


def _free_slot(lock: str, key: str) -> str:
    """The slot of ``:k`` that *lock* took for *key*; NULL when all are held.

    *lock* is an advisory lock function, *key* an SQL expression (the lock's first half). CASE
    runs the scan (a generate_series of K rows) only when the first slot is taken; LIMIT 1
    stops it at the first lock taken, so one slot at most is claimed.
    """
    k = "CAST(:k AS integer)"
    return (
        f"CASE WHEN {lock}({key}, mod({_FIRST}, {k})) THEN mod({_FIRST}, {k}) "
        f"ELSE (SELECT mod(slot + {_FIRST}, {k}) FROM generate_series(1, {k} - 1) AS slot "
        f"WHERE {lock}({key}, mod(slot + {_FIRST}, {k})) LIMIT 1) END"
    )


def _claim_of(name: str, k: str) -> str:
    """Whether a slot of *k* named *name* (SQL expressions) was taken, as the claim takes it."""
    return (
        f"CASE WHEN pg_try_advisory_xact_lock(hashtext({name}), mod({_FIRST}, {k})) "
        f"THEN true ELSE EXISTS (SELECT FROM generate_series(1, {k} - 1) AS slot "
        f"WHERE pg_try_advisory_xact_lock(hashtext({name}), "
        f"mod(slot + {_FIRST}, {k}))) END"
    )


def _claim_few(count: int) -> str:
    """The claim of *count* limits (``:name_a``, ``:k_a``, ...): how many got one.

    Scalar parameters: cheaper than the JSON of :data:`FLOW_CLAIM_SLOTS` for the one or two
    limits of a single message's receive.
    """
    parts = []
    for letter in "abcdefgh"[:count]:
        name, limit = f"hashtext(:name_{letter})", f"CAST(:k_{letter} AS integer)"
        parts.append(
            f"(CASE WHEN pg_try_advisory_xact_lock({name}, mod({_FIRST}, {limit})) "
            f"THEN 1 ELSE (SELECT count(*) FROM (SELECT FROM generate_series(1, {limit} - 1) "
            f"AS slot WHERE pg_try_advisory_xact_lock({name}, "
            f"mod(slot + {_FIRST}, {limit})) LIMIT 1) AS taken) END)"
        )
    return "SELECT " + (" + ".join(parts) or "0")


#: Most limits claimed with scalar parameters (:func:`_claim_few`); more go through JSON.
FEW_CLAIMS = 8

#: Two groups of names, each a JSON array of text sharing one limit and one prefix of the lock
#: names (a batch's keys after the queue's key prefix, and the global slot's name after ''):
#: one text parameter per group costs the driver and the server far less than a text[] of many
#: names, and the keys alone less than their whole lock names.
FLOW_CLAIM_SLOTS = "SELECT " + " + ".join(
    f"(SELECT count(*) FROM json_array_elements_text(CAST(:names_{group} AS json)) "
    f"AS wanted(name) CROSS JOIN LATERAL (SELECT hashtext(CAST(:prefix_{group} AS text) "
    f"|| wanted.name) AS hashed) AS lock WHERE CASE WHEN pg_try_advisory_xact_lock("
    f"lock.hashed, mod(CAST(:first AS integer), CAST(:k_{group} AS integer))) THEN true "
    f"ELSE EXISTS (SELECT FROM generate_series(1, CAST(:k_{group} AS integer) - 1) AS slot "
    f"WHERE pg_try_advisory_xact_lock(lock.hashed, "
    f"mod(slot + CAST(:first AS integer), CAST(:k_{group} AS integer)))) END)"
    for group in "ab"
)

#: Where the receive's row holds its key: the value after the first ``"<header>":"``
#: (``:pattern``) up to the next quote, NULL when that is absent or empty. Plain text functions,
#: no JSON parsing in SQL (which a row of unreadable headers would make fail).
_FOUND_KEY = "NULLIF(split_part(split_part(headers, CAST(:pattern AS text), 2), '\"', 1), '')"
_KEY_LOCK = f"hashtext(CAST(:prefix AS text) || {_FOUND_KEY})"

#: The claims of the received messages' key slots and of the global slot, as further columns
#: of the receive's own RETURNING list: ONE statement takes the rows and their slots. Per row:
#: the key read from the stored headers text where it has the compact JSON form
#: ``"<header>":"<value>"`` (our serializer's and NServiceBus's), then the claim of that key's
#: slot (``:prefix`` || key, ``:k`` slots, ``:first`` first; NULL without a key); and the global
#: slot's claim (``:gname``, ``:gk`` slots; ``:gk`` 0: none), a scalar subquery run once, at the
#: first row. The caller checks each key read here against the headers as parsed: a key read
#: otherwise (JSON escapes, a header written twice or spaced) has its slot claimed by a second
#: statement; a lock taken for a misread key only restricts (it ends with the transaction).
#: Columns of RETURNING rather than a CTE around the DELETE: the CTE costs the server more per
#: row than these columns do.
FLOW_RECEIVE_CLAIMING = (
    f"{_FOUND_KEY}, CASE WHEN pg_try_advisory_xact_lock({_KEY_LOCK}, "
    "mod(CAST(:first AS integer), CAST(:k AS integer))) THEN true "
    f"WHEN {_FOUND_KEY} IS NULL THEN NULL "
    "ELSE EXISTS (SELECT FROM generate_series(1, CAST(:k AS integer) - 1) AS slot "
    f"WHERE pg_try_advisory_xact_lock({_KEY_LOCK}, "
    "mod(slot + CAST(:first AS integer), CAST(:k AS integer)))) END, "
    "(SELECT CASE WHEN CAST(:gk AS integer) = 0 THEN true ELSE "
    + _claim_of("CAST(:gname AS text)", "CAST(:gk AS integer)")
    + " END)"
)

#: The global slot's claim alone as a further column of the receive's RETURNING list: the
#: global limit without a per-key one, one statement per receive instead of two. A scalar
#: subquery, so it runs once, at the first row (no row: no lock).
FLOW_RECEIVE_GATED = "(SELECT " + _claim_of("CAST(:gname AS text)", "CAST(:gk AS integer)") + ")"

#: A key slot claimed for the session, so it stays held from one batch to the next: each name
#: of the JSON array ``:names`` (after ``:prefix``) tried from ``:first`` on; one row per name
#: with the slot taken, NULL when all ``:k`` are held. The same locks as the transaction's
#: claims: the two count together.
FLOW_LEASE = (
    "SELECT wanted.name, "
    + _free_slot("pg_try_advisory_lock", "lock.hashed")
    + " FROM json_array_elements_text(CAST(:names AS json)) AS wanted(name) "
    "CROSS JOIN LATERAL (SELECT hashtext(CAST(:prefix AS text) || wanted.name) AS hashed) AS lock"
)
FLOW_UNLEASE = (
    "SELECT count(*) FILTER (WHERE pg_advisory_unlock(hashtext(CAST(:prefix AS text) "
    "|| (held.value ->> 0)), CAST(held.value ->> 1 AS integer))) "
    "FROM json_array_elements(CAST(:held AS json)) AS held"
)

#: The rate schedule's reservation. The clock is read before the row lock is granted: a caller
#: that waited reserves after the one it waited for (next_at only grows) and sleeps a little
#: longer than it needs.
FLOW_RESERVE = (
    "WITH now AS (SELECT EXTRACT(EPOCH FROM clock_timestamp()) AS t) "
    "UPDATE {table} SET next_at = GREATEST(next_at, (SELECT t FROM now) - "
    "CAST(:tau AS float8)) + CAST(:step AS float8) "
    "WHERE name = :name AND GREATEST(next_at, (SELECT t FROM now) - CAST(:tau AS float8)) "
    "- (SELECT t FROM now) <= CAST(:wait AS float8) "
    "RETURNING next_at - CAST(:step AS float8) - (SELECT t FROM now)"
)

FLOW = flow.FlowStatements(
    claim_slot="SELECT " + _free_slot("pg_try_advisory_xact_lock", "hashtext(:name)"),
    claim_slots=FLOW_CLAIM_SLOTS,
    grouped_claims=True,
    few_claims=tuple(_claim_few(count) for count in range(FEW_CLAIMS + 1)),
    receive_claiming=FLOW_RECEIVE_CLAIMING,
    receive_gated=FLOW_RECEIVE_GATED,
    lease=FLOW_LEASE,
    unlease=FLOW_UNLEASE,
    backend="SELECT pg_backend_pid()",
    reserve=FLOW_RESERVE,
    reserve_alone=True,  # one UPDATE: no BEGIN and COMMIT round trips around it
)


# Every field stated by name, in the same shape as the other dialect modules' SUPPORT and
# base.GENERIC, on purpose: each database states its own tables, statements and errors, so
# none takes another's value by omission (tests/unit/test_every_dialect_states_its_layout.py).
SUPPORT = PostgresqlSupport(
    hot_path=HOT_PATH,
    body_contains="position(:needle IN {body}) > 0",
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
    identifier_limit=IDENTIFIER_LIMIT,
    identifier_unit="bytes",
    creates_schemas=True,
    address_form=base.AddressForm.SCHEMA_QUALIFIED,
    queue_layout=base.QueueLayout.SEQ,
    queue_signature=QUEUE_SIGNATURE,
    # NServiceBus's PostgreSqlConstants.AddMessageBodyStringColumn: BodyString unquoted.
    body_string_column="bodystring",
    # encode(..., 'escape') never fails on bytes that are not UTF-8 (a generated column that
    # fails would block the send); the body column is unquoted ``body`` in this layout.
    body_string_ddl=(
        "ALTER TABLE {table} ADD COLUMN bodystring TEXT GENERATED ALWAYS AS "
        "(encode(body, 'escape')) STORED"
    ),
    system_schemas=frozenset({"information_schema", "pg_catalog"}),
    system_schema_prefixes=("pg_toast", "pg_temp"),  # pg_toast_temp_<n> and pg_temp_<n> too
    catalog_casts=r"::\w+( \w+)*",  # pg_get_expr's casts: '...'::timestamp without time zone
    # Transaction-scoped: an installer that fails releases it with its rollback.
    install_lock="SELECT pg_advisory_xact_lock(hashtextextended(:resource, 0))",
    missing_table_markers=("42p01", "undefinedtable"),
    missing_column_markers=("42703",),
    transient_markers=(*base.GENERIC_TRANSIENT, "40p01"),  # 40P01: deadlock detected
    # NServiceBus's CreateSubscriptionTableText writes them unquoted: lower case.
    subscription_columns=("queueaddress", "endpoint", "topic"),
    flow=FLOW,
    url_schemes=("postgres",),
    driver="psycopg",
    driver_extra="postgres",
    connect_defaults=CONNECT_DEFAULTS,
    tells_statement_waiting=True,
    async_driver="asyncpg",
    script_separator=";\n",
    subscribe=base.SUBSCRIBE_UPSERT,
    unsubscribe=base.UNSUBSCRIBE,
    subscribers=base.SUBSCRIBERS,
    alter_column="alter",
    control=control.CONTROL_UPSERTS,
)
