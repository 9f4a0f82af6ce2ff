"""Flow control shared by every process on a queue (issue 17): global and per-key concurrency.

``EndpointSettings(global_concurrency=K)``: at most K messages of the queue are handled at once,
counted across every process and every endpoint instance receiving from it with the same limit.
Its state lives in locks, never in a column of the queue table (which .NET endpoints share):

* **PostgreSQL**: K transaction-scoped advisory locks, ``(hashtext('sqlqueue.slots.' ||
  <queue address>), 0..K-1)``. The receive's transaction takes a free one
  (``pg_try_advisory_xact_lock``) and holds it until it commits or rolls back, so the slot
  covers the receive, the handlers and the commit; a crash frees it with the connection. The
  receive claims it in its own statement (:data:`RECEIVE_GATED`; with a per-key limit,
  :data:`RECEIVE_CLAIMING`); when that is refused the rows go back and, for
  :data:`REFUSAL_PAUSE` seconds, the worker claims in a statement of its own before it receives,
  so a limit that binds touches no row it cannot keep. Each worker thread tries its own slot
  first (its number in the process plus a random offset per process, modulo K), then the next
  ones: while the limit is far from binding the first lock tried is free.
* **SQL Server**: the same with ``sp_getapplock`` (``@LockOwner = 'Transaction'``, no wait) on
  K resources named after a SHA-256 of the queue address.
* **SQLite**: one process only (the database has no shared locks to hold): a semaphore of K
  per database file and queue, shared by the endpoints of this process.

A worker that finds every slot taken keeps its transaction open without locks and tries again
every 5 to 20 ms for up to :data:`SLOT_WAIT` seconds, then gives up (the pump peeks again).
The limit needs a mode whose transaction spans the handling: NONE is refused on PostgreSQL and
SQL Server. The claims run on the driver's cursor, as the receive does.

**Per key** (``key_header="customer", key_concurrency=K``): at most K messages with one value
of that header in flight, while other keys pass a slow one. Slots are the same locks as the
global limit's, named after the queue and the key (on PostgreSQL the name is hashed to 32 bits:
two keys may share a limit, which can only restrict, never exceed). Two paths:

* **Optimistic** (PostgreSQL, SQL Server, not ``key_fifo``; the first receive of a
  transaction): on PostgreSQL the receive takes the rows and, in the same statement, a slot of
  each row's key and the global slot (:data:`RECEIVE_CLAIMING`: the key read from the headers
  text in SQL, checked against the parsed headers afterwards). On SQL Server the plain receive
  (``READPAST``) takes the rows, their keys are read in Python, and ONE statement
  (:data:`CLAIM_SLOTS`) takes a slot of every key and the global slot. If any is refused, the
  transaction, which holds nothing but those rows and locks, is rolled back (the rows are back
  in their places, unhandled) and this attempt takes the careful path. So a limit far from
  binding costs no statement of its own on PostgreSQL and one per receive on SQL Server.
* **Careful**: the global slot first, then the oldest ``key_window`` rows read without taking
  them (a plain read, pages of 10 or more), and for each, under a SAVEPOINT, the row taken by
  its native id (skipped if another receiver holds it), then a slot of its key. A busy key's
  row is released by rolling back the SAVEPOINT, and no later row of that key is tried in the
  same scan. With ``key_fifo=True`` (needs K = 1, always careful: the optimistic receive could
  take a later message of a key while another worker holds its earlier one, not yet locked) a
  key whose oldest visible row another receiver holds is also skipped for the rest of the scan,
  so its messages are handled one after the other in queue order (immediate retries included;
  a delayed retry or a move to the error queue lets the next one go).

A batch holds **one slot per key** however many of its messages have that key (the locks are
re-entrant within a transaction; with K > 1 a slot of the key freed by another worker while
the one statement runs may make it two, which only restricts): with K = 1 a batch may take two
messages of one key, which it handles one after the other, never at once, while no other worker
gets that key until the batch commits. A message **without the header** (one a .NET endpoint
sent) has no key: it is not limited (only by ``concurrency`` and ``global_concurrency``).
SQLite: the key slots are counted within this process (always the careful path).

**Batched** (PostgreSQL, a direct connection): a worker keeps its keys' slots from one batch to
the next, claimed for the session instead of the transaction, and claims only the keys new to
it (:class:`_Leases` says when they are given back, and where they are not used).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Final, cast

import sqlalchemy as sa

from sqlqueue_orm import dialects, exceptions
from sqlqueue_orm.models import rate_limit
from sqlqueue_orm.queuing import sql, table_queue

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Longest a worker waits for a free slot before it gives up this receive.
SLOT_WAIT = 0.5
#: Prefix of the lock names (PostgreSQL: hashed into the advisory lock's first key).
LOCK_PREFIX = "sqlqueue.slots."
#: Prefix of a key's lock names: then the queue, U+001F, the key.
KEY_PREFIX = "sqlqueue.key."
#: Fewest rows read per page of the per-key scan.
MIN_KEY_PAGE = 10

def _free_slot(lock: str, key: str) -> str:
    """PostgreSQL: the slot of ``:k`` that *lock* took for *key*; NULL when all are held.

    *lock* is an advisory lock function, *key* an SQL expression (the lock's first half); it
    tries ``:first`` first, then the next ones (modulo ``:k``).

    CASE runs the scan (a generate_series of K rows) only when the first slot is taken; LIMIT 1
    stops it at the first lock taken, so one slot at most is claimed.
    """
    first, k = "CAST(:first AS integer)", "CAST(:k AS integer)"
    return (
        f"CASE WHEN {lock}({key}, mod({first}, {k})) THEN mod({first}, {k}) "
        f"ELSE (SELECT mod(slot + {first}, {k}) FROM generate_series(1, {k} - 1) AS slot "
        f"WHERE {lock}({key}, mod(slot + {first}, {k})) LIMIT 1) END"
    )


#: Claim a free slot of ``:k`` in the caller's transaction, trying ``:first`` first, then the
#: next ones (modulo ``:k``); the slot number, or no row (PostgreSQL) or -1 (SQL Server) when all
#: are held. LIMIT 1 stops the scan at the first lock taken, so one slot at most is claimed.
#: Each worker has its own ``:first`` (see :func:`_first_slot`), so while the limit is far from
#: binding the first try succeeds.
CLAIM_SLOT: Final[dict[str, str]] = {
    "postgresql": "SELECT " + _free_slot("pg_try_advisory_xact_lock", "hashtext(:name)"),
    # EXEC takes variables, not expressions: the resource name is built in @resource first.
    "mssql": (
        "SET NOCOUNT ON; "
        "DECLARE @k int = :k, @first int = :first, @slot int = 0, @result int, "
        "@resource nvarchar(255), "
        "@base nvarchar(64) = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
        "CAST(:name AS nvarchar(4000))), 2); "
        "WHILE @slot < @k BEGIN "
        "SET @resource = N'sqlqueue.slots.' + @base + N'.' "
        "+ CAST((@slot + @first) % @k AS nvarchar(10)); "
        "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Transaction', @LockTimeout = 0; "
        "IF @result >= 0 BREAK; "
        "SET @slot += 1; "
        "END; "
        "SELECT CASE WHEN @slot < @k THEN (@slot + @first) % @k ELSE -1 END;"
    ),
}

#: Claim one slot of each of several limits in one statement (the per-key limit's optimistic
#: path: the slots of the received messages' keys and the global slot together), each tried from
#: ``:first`` on as :data:`CLAIM_SLOT` does; how many limits got one. The locks and their names
#: are those of :data:`CLAIM_SLOT`, so both statements count the same slots. A limit refused
#: leaves the others' locks taken: the caller rolls the whole transaction back.
CLAIM_SLOTS: Final[dict[str, str]] = {
    # Two groups of names, each a JSON array of text sharing one limit and one prefix of the
    # lock names (a batch's keys after the queue's key prefix, and the global slot's name after
    # ''): one text parameter per group costs the driver and the server far less than a text[]
    # of a hundred names (measured: 100 names, 110 us against 220 us a statement), and the
    # keys alone less than their whole lock names (a tenth of the text to write and parse).
    "postgresql": "SELECT " + " + ".join(
        f"(SELECT count(*) FROM json_array_elements_text(CAST(:names_{group} AS json)) "
        f"AS wanted(name) CROSS JOIN LATERAL (SELECT hashtext(CAST(:prefix_{group} AS text) "
        f"|| wanted.name) AS hashed) AS lock WHERE CASE WHEN pg_try_advisory_xact_lock("
        f"lock.hashed, mod(CAST(:first AS integer), CAST(:k_{group} AS integer))) THEN true "
        f"ELSE EXISTS (SELECT FROM generate_series(1, CAST(:k_{group} AS integer) - 1) AS slot "
        f"WHERE pg_try_advisory_xact_lock(lock.hashed, "
        f"mod(slot + CAST(:first AS integer), CAST(:k_{group} AS integer)))) END)"
        for group in "ab"
    ),
    # :claims is a JSON array of [name, limit, index] (SQL Server 2016+: OPENJSON; a schema,
    # not JSON_VALUE, which gives NULL past 4,000 characters); the loop stops at the first
    # limit refused.
    "mssql": (
        "SET NOCOUNT ON; "
        "DECLARE @first int = :first, @i int = 0, @n int, @k int, @slot int, @result int, "
        "@name nvarchar(max), @base nvarchar(64), @resource nvarchar(255); "
        "DECLARE @wanted TABLE (i int PRIMARY KEY, name nvarchar(max), k int); "
        "INSERT INTO @wanted (i, name, k) SELECT i, name, k "
        "FROM OPENJSON(CAST(:claims AS nvarchar(max))) "
        "WITH (name nvarchar(max) '$[0]', k int '$[1]', i int '$[2]'); "
        "SELECT @n = COUNT(*) FROM @wanted; "
        "WHILE @i < @n BEGIN "
        "SELECT @name = name, @k = k FROM @wanted WHERE i = @i; "
        "SET @base = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
        "CAST(@name AS nvarchar(4000))), 2); "
        "SET @slot = 0; SET @result = -1; "
        "WHILE @slot < @k AND @result < 0 BEGIN "
        "SET @resource = N'sqlqueue.slots.' + @base + N'.' "
        "+ CAST((@slot + @first) % @k AS nvarchar(10)); "
        "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Transaction', @LockTimeout = 0; "
        "SET @slot += 1; "
        "END; "
        "IF @result < 0 BREAK; "
        "SET @i += 1; "
        "END; "
        "SELECT @i;"
    ),
}

def _claim_of(name: str, k: str) -> str:
    """PostgreSQL: whether a slot of *k* named *name* (SQL expressions) was taken.

    As :data:`CLAIM_SLOT` takes it: ``:first`` first, then the next ones.
    """
    return (
        f"CASE WHEN pg_try_advisory_xact_lock(hashtext({name}), mod(CAST(:first AS integer), {k})) "
        f"THEN true ELSE EXISTS (SELECT FROM generate_series(1, {k} - 1) AS slot "
        f"WHERE pg_try_advisory_xact_lock(hashtext({name}), "
        f"mod(slot + CAST(:first AS integer), {k}))) END"
    )


#: Where the receive's row holds its key: the value after the first ``"<header>":"``
#: (``:pattern``) up to the next quote, NULL when that is absent or empty. Plain text functions,
#: no JSON parsing in SQL (which a row of unreadable headers would make fail).
_FOUND_KEY = (
    "NULLIF(split_part(split_part(headers, CAST(:pattern AS text), 2), '\"', 1), '')"
)
_KEY_LOCK = f"hashtext(CAST(:prefix AS text) || {_FOUND_KEY})"

#: The claims of the received messages' key slots and of the global slot, as further columns
#: of the receive's own RETURNING list: ONE statement takes the rows and their slots
#: (PostgreSQL; the per-key limit's optimistic path). Per row: the key read from the stored
#: headers text where it has the compact JSON form ``"<header>":"<value>"`` (our serializer's
#: and NServiceBus's), then the claim of that key's slot (``:prefix`` || key, ``:k`` slots,
#: ``:first`` first: :func:`_claim_of`'s order; NULL without a key); and the global slot's
#: claim (``:gname``, ``:gk`` slots; ``:gk`` 0: none), a scalar subquery run once, at the first
#: row. The caller checks each key read here against the headers as parsed: a key read otherwise
#: (JSON escapes, a header written twice or spaced) has its slot claimed by a second statement;
#: a lock taken for a misread key only restricts (it is released with the transaction).
#:
#: As columns of RETURNING, not a CTE around the DELETE: measured on batches of 100 (PostgreSQL
#: 15, prepared, 8 alternating rounds), the CTE cost the server 3.0 us a row over the plain
#: receive, these columns 1.0 us, and the receive followed by the many-key claim
#: (:data:`CLAIM_SLOTS`) 1.3 us of server and about 1 us of client CPU a row, plus its round trip.
RECEIVE_CLAIMING: Final[dict[str, str]] = {
    "postgresql": (
        f"{_FOUND_KEY}, CASE WHEN pg_try_advisory_xact_lock({_KEY_LOCK}, "
        "mod(CAST(:first AS integer), CAST(:k AS integer))) THEN true "
        f"WHEN {_FOUND_KEY} IS NULL THEN NULL "
        "ELSE EXISTS (SELECT FROM generate_series(1, CAST(:k AS integer) - 1) AS slot "
        f"WHERE pg_try_advisory_xact_lock({_KEY_LOCK}, "
        "mod(slot + CAST(:first AS integer), CAST(:k AS integer)))) END, "
        "(SELECT CASE WHEN CAST(:gk AS integer) = 0 THEN true ELSE "
        + _claim_of("CAST(:gname AS text)", "CAST(:gk AS integer)")
        + " END)"
    ),
}

#: The global slot's claim alone as a further column of the receive's RETURNING list
#: (PostgreSQL; ``:gname``, ``:gk`` slots): the global limit without a per-key one, one
#: statement per receive instead of two. A scalar subquery, so it runs once, at the first row
#: (no row: no lock).
RECEIVE_GATED: Final[dict[str, str]] = {
    "postgresql": "(SELECT " + _claim_of("CAST(:gname AS text)", "CAST(:gk AS integer)") + ")",
}
#: Seconds a limit takes the slots before the rows (the global limit: its claim in a statement
#: of its own; per key: the careful path) after a receive that took both at once was refused: a
#: limit that binds costs a rolled-back receive (and psycopg its prepared statements) about once
#: in this long, not on every receive.
REFUSAL_PAUSE = 1.0

#: Most limits claimed with :func:`_claim_few` (one statement per count, no arrays) on
#: PostgreSQL; more go through :data:`CLAIM_SLOTS`.
FEW = 8


def _claim_few(count: int) -> str:
    """PostgreSQL: the claim of *count* limits (``:name_a``, ``:k_a``, ...); how many got one.

    Scalar parameters: cheaper than :data:`CLAIM_SLOTS`' JSON for the one or two limits of a
    single message's receive.
    """
    parts = []
    for letter in "abcdefgh"[:count]:
        name, limit = f"hashtext(:name_{letter})", f"CAST(:k_{letter} AS integer)"
        parts.append(
            f"(CASE WHEN pg_try_advisory_xact_lock({name}, mod(CAST(:first AS integer), {limit})) "
            f"THEN 1 ELSE (SELECT count(*) FROM (SELECT FROM generate_series(1, {limit} - 1) "
            f"AS slot WHERE pg_try_advisory_xact_lock({name}, "
            f"mod(slot + CAST(:first AS integer), {limit})) LIMIT 1) AS taken) END)"
        )
    return "SELECT " + (" + ".join(parts) or "0")


_FEW_CLAIMS = [_claim_few(count) for count in range(FEW + 1)]

#: A key slot claimed for the session, so it stays held from one batch to the next (PostgreSQL,
#: batched; see :class:`_Leases`): each name of the JSON array ``:names`` (after ``:prefix``)
#: tried from ``:first`` on, as :data:`CLAIM_SLOT` does; one row per name with the slot taken,
#: NULL when all ``:k`` are held. The same locks as the transaction's claims: the two count
#: together.
LEASE = (
    "SELECT wanted.name, "
    + _free_slot("pg_try_advisory_lock", "lock.hashed")
    + " FROM json_array_elements_text(CAST(:names AS json)) AS wanted(name) "
    "CROSS JOIN LATERAL (SELECT hashtext(CAST(:prefix AS text) || wanted.name) AS hashed) AS lock"
)
#: Give back session key slots: ``:held`` a JSON array of ``[name, slot]`` (after ``:prefix``).
UNLEASE = (
    "SELECT count(*) FILTER (WHERE pg_advisory_unlock(hashtext(CAST(:prefix AS text) "
    "|| (held.value ->> 0)), CAST(held.value ->> 1 AS integer))) "
    "FROM json_array_elements(CAST(:held AS json)) AS held"
)
#: The server process of the session (compared with the one the connection was opened to).
BACKEND = "SELECT pg_backend_pid()"
#: libpq's transaction status of a connection outside any transaction (``PQTRANS_IDLE``), as
#: psycopg's ``connection.info.transaction_status`` gives it.
_IDLE = 0
#: Where a connection's :class:`_Leases` are kept (``Connection.info``: one per DBAPI connection).
_LEASES = "sqlqueue.key_leases"


class _Leases:
    """The key slots one DBAPI connection holds for its session (PostgreSQL, batched pump).

    A batch that claims its keys' slots in its transaction gives them back at its commit and
    claims them again in the next batch: with a hundred keys a batch, a hundred locks taken and
    released per batch, on every worker, while nothing else wants them. A lease is the same
    slot claimed for the session instead (:data:`LEASE`): a worker keeps the slots of the keys
    its batches keep bringing, and claims only keys new to it. Never more than the limit: a
    lease is a slot like any other, so a key's leases and transaction claims together are at
    most ``key_concurrency``; a leased key whose messages are not in the worker's batch only
    holds a slot it does not use, which restricts. A lease is given back

    * at the next receive whose batch does not have its key (the batch that had it committed
      or rolled back before that receive ran);
    * when a claim was refused, by this worker or another of the process (they take the
      careful path for a while, holding none);
    * when the connection goes back to the pool (:func:`_give_back`, a pool ``checkin``
      listener; if that fails, the connection is closed, and the server frees them);
    * when the connection breaks or is closed: the server frees a session's locks with it.

    Only on a direct connection to the server: ``pg_backend_pid()`` must be the process the
    driver connected to. Behind a pooler in transaction mode (PgBouncer) the next transaction
    may run on another server connection, where a lease could be neither used nor given back;
    PgBouncer answers the connection with a process id of its own (tested), so leases are off
    there. A pooler that passed the server's own id through would defeat this check.
    """

    __slots__ = ("held", "unlease")

    def __init__(self, unlease: sql.Statement) -> None:
        #: Per key prefix (queue): key -> the slot leased.
        self.held: dict[str, dict[str, int]] = {}
        self.unlease = unlease


def _unlease_values(prefix: str, held: Collection[tuple[str, int]]) -> dict[str, str]:
    """:data:`UNLEASE`'s parameters for the leases *held* (key, slot) after *prefix*."""
    return {"prefix": prefix, "held": json.dumps(list(held))}


def _give_back(dbapi_connection: Any, record: Any) -> None:
    """Pool ``checkin`` listener: a connection's leases end with its checkout (:class:`_Leases`).

    First a rollback when the connection is in a transaction still (a reset that failed, a
    connection dropped without being closed): the commit that ends the statement giving the
    leases back must never commit it. Not otherwise: psycopg forgets its prepared statements
    on a rollback. If giving them back fails, the connection is closed instead (the server
    frees them).
    """
    leases = record.info.get(_LEASES)
    if not leases or dbapi_connection is None or not any(leases.held.values()):
        return
    try:
        status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", None)
        if status != _IDLE:  # (not known: roll back)
            dbapi_connection.rollback()
        cursor = dbapi_connection.cursor()
        try:
            for prefix, held in leases.held.items():
                if held:
                    values = _unlease_values(prefix, held.items())
                    cursor.execute(leases.unlease.text, leases.unlease.params(values))
        finally:
            cursor.close()
        dbapi_connection.commit()
    except BaseException as error:  # the driver's own, or an interrupt: closing frees them
        log.warning("giving back key slots failed, closing the connection: %s", error)
        record.invalidate(error if isinstance(error, Exception) else None)
        if not isinstance(error, Exception):
            raise
    finally:
        for held in leases.held.values():
            held.clear()


_local_lock = threading.Lock()
_local_semaphores: dict[tuple[str, str], tuple[int, threading.BoundedSemaphore]] = {}


def _semaphore(engine: Engine, name: str, limit: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of *name* in *engine*'s database (SQLite)."""
    key = (engine.url.render_as_string(hide_password=True), name)
    with _local_lock:
        found = _local_semaphores.get(key)
        if found is None:
            found = _local_semaphores[key] = (limit, threading.BoundedSemaphore(limit))
        elif found[0] != limit:
            raise exceptions.ConfigurationError(
                f"queue {name}: global_concurrency {limit} differs from the {found[0]} another "
                "endpoint of this process set on the same queue"
            )
        return found[1]


_worker_numbers = itertools.count()
_process_offset = random.randrange(1 << 16)  # noqa: S311  (spreads processes, not secrets)
_worker = threading.local()


def _first_slot(limit: int) -> int:
    """The slot this worker thread tries first: its number in the process, offset per process.

    Workers of one process prefer different slots, so with a limit far above the load each
    first try succeeds (one lock, no scan past slots others hold).
    """
    number = getattr(_worker, "number", None)
    if number is None:
        number = _worker.number = next(_worker_numbers)
    return (_process_offset + number) % limit


def _rendered(template: str, connection: Connection) -> sql.Statement:
    """*template* rendered once per dialect for its driver (hot path: the driver's cursor)."""
    dialect = connection.dialect
    key = (template, dialect.name, dialect.paramstyle)
    statement = _rendered_statements.get(key)
    if statement is None:
        statement = _rendered_statements[key] = sql.render(template, dialect, "")
    return statement


_rendered_statements: dict[tuple[str, str, str], sql.Statement] = {}


def _scalar(connection: Connection, template: str, values: dict[str, Any]) -> Any:
    """The first column of the first row of *template* run in *connection*'s transaction.

    Through the driver's cursor, as the receive runs (SQLAlchemy's statement machinery costs
    as much as the round trip), unless something listens to the statements.
    """
    rows = _rows(connection, template, values)
    return rows[0][0] if rows else None


def _rows(connection: Connection, template: str, values: dict[str, Any]) -> list[Any]:
    """Every row of *template* run in *connection*'s transaction, as :func:`_scalar` runs it."""
    statement = _rendered(template, connection)
    params = statement.params(values)
    cursor = table_queue._driver_cursor(connection)  # the receive's own (same module family)
    if cursor is None:
        return list(connection.exec_driver_sql(statement.text, params))
    try:
        cursor.execute(statement.text, params)
        return cursor.fetchall()  # type: ignore[no-any-return]
    finally:
        cursor.close()


def _try_slot(connection: Connection, template: str, limit: int, name: str) -> bool:
    """Take a free one of *limit* slots named *name*, for the transaction; no waiting."""
    values = {"k": limit, "name": name, "first": _first_slot(limit)}
    number = _scalar(connection, template, values)
    return number is not None and int(number) >= 0


#: One group of a many-limit claim: a prefix, the names after it (each lock's name is the
#: prefix then the name) and the slots of each.
Claim = tuple[str, Collection[str], int]


def _try_slots(connection: Connection, claims: list[Claim]) -> bool:
    """Take one slot of each limit of *claims* in one statement; all or False.

    On False some were taken: the caller rolls the transaction back.
    """
    dialect = connection.dialect
    grouped = dialects.for_dialect(dialect).slot_claims == "grouped"
    wanted = sum(len(names) for _prefix, names, _limit in claims)
    first = _first_slot(max(limit for _prefix, _names, limit in claims))
    template = CLAIM_SLOTS[dialect.name]
    values: dict[str, Any] = {"first": first}
    if grouped and wanted <= FEW:
        template = _FEW_CLAIMS[wanted]
        letters = iter("abcdefgh")
        for prefix, names, limit in claims:
            for name in names:
                letter = next(letters)
                values[f"name_{letter}"] = prefix + name
                values[f"k_{letter}"] = limit
    elif grouped:
        if len(claims) > 2:
            raise ValueError(f"at most two groups of limits per claim, not {len(claims)}")
        values.update(prefix_b="", names_b="[]", k_b=1)
        for letter, (prefix, names, limit) in zip("ab", claims, strict=False):
            values[f"prefix_{letter}"] = prefix
            values[f"names_{letter}"] = json.dumps(list(names))
            values[f"k_{letter}"] = limit
    else:
        full = [(prefix + name, limit) for prefix, names, limit in claims for name in names]
        values["claims"] = json.dumps(
            [[name, limit, index] for index, (name, limit) in enumerate(full)]
        )
    taken = _scalar(connection, template, values)
    return taken is not None and int(taken) == wanted


def _put_back(
    transport: Transport,
    queue: str | addressing.QueueAddress,
    connection: Connection,
    messages: list[IncomingMessage],
) -> None:
    """Roll back the transaction that took *messages* and nothing else (a slot was refused).

    The driver's rollback is the whole of it (the next statement begins a new transaction);
    the receive floor is told, so it does not pass the rows now back in their places.
    """
    try:
        connection.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
    except Exception as error:  # the driver's own: its state is not known, drop it
        connection.invalidate()
        raise exceptions.DatabaseError(
            f"queue {queue}: rolling back a receive whose slot was refused failed: {error}",
            transient=True,
        ) from error
    floor = transport._table_queue(queue).floor
    if floor is not None and messages:
        floor.returned(min(message.row_version for message in messages))


_local_key_counts: dict[tuple[str, str], dict[str, int]] = {}


def _key_counts(engine: Engine, name: str) -> dict[str, int]:
    """The process-wide messages in flight per key of *name* in *engine*'s database (SQLite)."""
    key = (engine.url.render_as_string(hide_password=True), name)
    with _local_lock:
        return _local_key_counts.setdefault(key, {})


class GlobalConcurrency:
    """At most *limit* messages of one queue in flight across processes (module docstring).

    :param engine: the queue's database.
    :param name: the queue's address as text (what the lock names are made of).
    :param limit: slots.
    """

    def __init__(self, engine: Engine, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.local = dialects.for_dialect(engine).single_writer
        self._semaphore = _semaphore(engine, name, limit) if self.local else None
        self._statement = None if self.local else CLAIM_SLOT[engine.dialect.name]
        #: The one-statement receive and claim (PostgreSQL), or None.
        self._gated = None if self.local else RECEIVE_GATED.get(engine.dialect.name)
        #: Until when (monotonic) :meth:`claim` runs first instead (a refusal was recent).
        self._claim_first_until = 0.0

    @property
    def lock_name(self) -> str:
        """The name the slots' locks are made of."""
        return LOCK_PREFIX + self.name

    def enter(self) -> bool:
        """SQLite: take a slot of this process (wait up to :data:`SLOT_WAIT`); else True."""
        if self._semaphore is None:
            return True
        return self._semaphore.acquire(timeout=SLOT_WAIT)

    def leave(self) -> None:
        """SQLite: give the slot :meth:`enter` took back."""
        if self._semaphore is not None:
            self._semaphore.release()

    @property
    def receives(self) -> bool:
        """Whether :meth:`receive` should take the slot (no :meth:`claim` first).

        PostgreSQL, while no one-statement receive was refused in the last
        :data:`REFUSAL_PAUSE` seconds.
        """
        return self._gated is not None and time.monotonic() >= self._claim_first_until

    def receive(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        connection: Connection,
        count: int,
    ) -> list[IncomingMessage]:
        """Take up to *count* messages and a slot in one statement (:data:`RECEIVE_GATED`).

        Refused (every slot held): the rows go back, the slot is claimed on its own as
        :meth:`claim` does (waiting up to :data:`SLOT_WAIT`), and then the plain receive runs;
        for :data:`REFUSAL_PAUSE` seconds :attr:`receives` is False, so the worker claims first.
        """
        assert self._gated is not None
        values = {"gname": self.lock_name, "gk": self.limit, "first": _first_slot(self.limit)}
        taken, columns = transport.receive_returning(
            queue, count, connection, self._gated, values
        )
        if not taken or columns[0][0]:  # nothing taken, or the slot claimed
            return taken
        self._claim_first_until = time.monotonic() + REFUSAL_PAUSE
        _put_back(transport, queue, connection, taken)
        if not self.claim(connection):
            return []
        return transport.receive(queue, count, connection=connection)

    def claim(self, connection: Connection) -> bool:
        """Take a free slot for the life of *connection*'s transaction; False if none came."""
        if self._statement is None:
            return True
        deadline = time.monotonic() + SLOT_WAIT
        while True:
            if _try_slot(connection, self._statement, self.limit, self.lock_name):
                return True
            if time.monotonic() >= deadline:
                log.debug(
                    "queue %s: all %d global slots busy for %.1f s",
                    self.name,
                    self.limit,
                    SLOT_WAIT,
                )
                return False
            time.sleep(random.uniform(0.005, 0.02))  # noqa: S311  (jitter, not secrets)


class KeyConcurrency:
    """At most *limit* messages per value of the header *header* in flight (module docstring).

    :param engine: the queue's database.
    :param name: the queue's address as text (part of the lock names).
    :param header: the header whose value is the key.
    :param limit: messages of one key at once.
    :param fifo: strict order per key (needs *limit* 1).
    :param window: most rows one receive looks at.
    :param batched: whether the receives take batches (then, on PostgreSQL, the worker keeps
        its keys' slots from one batch to the next: :class:`_Leases`).
    """

    def __init__(
        self,
        engine: Engine,
        name: str,
        header: str,
        limit: int,
        fifo: bool,
        window: int,
        batched: bool = False,
    ) -> None:
        self.name = name
        self.header = header
        self.limit = limit
        self.fifo = fifo
        self.window = window
        self.local = dialects.for_dialect(engine).single_writer
        self._statement = None if self.local else CLAIM_SLOT[engine.dialect.name]
        #: Whether a receive first takes rows as the plain receive does, then their slots
        #: (PostgreSQL, SQL Server; never with *fifo*: see the module docstring).
        self.optimistic = not self.local and not fifo
        #: The one-statement receive and claim (PostgreSQL), or None.
        self._fold = RECEIVE_CLAIMING.get(engine.dialect.name) if self.optimistic else None
        #: Until when (monotonic) receives take the careful path (a refusal was recent).
        self._careful_until = 0.0
        #: Whether batches lease their keys' slots for the session (:class:`_Leases`); a
        #: worker whose batches keep bringing keys new to it claims per transaction instead
        #: (``_thread.folding``) until consecutive batches share most of their keys again.
        self._leasing = batched and self._fold is not None
        if self._leasing and not sa.event.contains(engine, "checkin", _give_back):
            sa.event.listen(engine, "checkin", _give_back)
        #: What each key's lock name starts with (the key follows; unit separator: PostgreSQL
        #: text has no NUL).
        self._prefix = f"{KEY_PREFIX}{name}\x1f"
        self._fold_values = {
            "prefix": self._prefix,
            "k": limit,
            # the key as our serializer and NServiceBus write it: compact, non-ASCII as itself
            "pattern": json.dumps(header, ensure_ascii=False) + ':"',
        }
        # SQLite: in flight per key, shared by every endpoint of this process on the queue
        self._counts = _key_counts(engine, name)
        self._counts_lock = _local_lock
        self._thread = threading.local()

    @property
    def takes_global_slot(self) -> bool:
        """Whether :meth:`receive` takes the global slot itself (the caller must not)."""
        return not self.local

    def key_of(self, message: IncomingMessage) -> str | None:
        """The message's key, or None (no header, or headers nobody can read: not limited)."""
        if message.headers_error is not None:
            return None
        return message.headers.get(self.header)

    def receive(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        connection: Connection,
        count: int,
        gate: GlobalConcurrency | None = None,
        first: bool = True,
    ) -> list[IncomingMessage]:
        """Take up to *count* of the oldest messages whose key has a free slot, in order.

        :param gate: the global limit, whose slot this receive takes with the key slots
            (PostgreSQL, SQL Server; see :attr:`takes_global_slot`).
        :param first: whether the transaction holds nothing yet (no row, no slot): only then
            may the optimistic path roll it back; a later receive of a batch is careful.
        """
        gate = None if gate is None or gate.local else gate
        leases = self._leases(connection) if first and self._leasing else None
        if first and self.optimistic and time.monotonic() < self._careful_until:
            # a slot was refused lately: the careful path, without a rolled-back receive, and
            # holding no lease (another worker of this process may have been the one refused)
            if leases is not None:
                self._unlease(connection, leases, None)
        elif leases is not None and not self._thread.__dict__.get("folding"):
            leased = self._receive_leasing(transport, queue, connection, count, gate, leases)
            if leased is not None:
                return leased
        elif first and self._fold is not None:
            if leases is not None:
                self._unlease(connection, leases, None)  # folding: this worker holds none
            taken, claimed = self._receive_claiming(transport, queue, connection, count, gate)
            if claimed:
                if leases is not None:
                    self._compare_keys(taken)
                return taken
            self._refused(transport, queue, connection, taken)
        elif first and self.optimistic:
            taken = transport.receive(queue, count, connection=connection)
            if not taken:
                return taken
            keys = {key for message in taken if (key := self.key_of(message)) is not None}
            claims: list[Claim] = []
            if keys:
                claims.append((self._prefix, keys, self.limit))
            if gate is not None:
                claims.append(("", (gate.lock_name,), gate.limit))
            if not claims or _try_slots(connection, claims):
                return taken
            # A slot was refused: put every row back (nothing was handled) and take the
            # careful path.
            self._refused(transport, queue, connection, taken)
        if first and gate is not None and not gate.claim(connection):
            return []
        return self._careful(transport, queue, connection, count)

    def _refused(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        connection: Connection,
        taken: list[IncomingMessage],
    ) -> None:
        """An optimistic receive's slot was refused: its rows go back.

        Receives take the careful path for :data:`REFUSAL_PAUSE` seconds.
        """
        self._careful_until = time.monotonic() + REFUSAL_PAUSE
        _put_back(transport, queue, connection, taken)

    def _leases(self, connection: Connection) -> _Leases | None:
        """*connection*'s leases, or None where it cannot hold any (not a direct connection)."""
        info = connection.info
        leases: _Leases | bool | None = info.get(_LEASES)
        if leases is None:
            driver_info = getattr(connection.connection.dbapi_connection, "info", None)
            pid = getattr(driver_info, "backend_pid", None)
            direct = pid is not None and _scalar(connection, BACKEND, {}) == pid
            if not direct:
                log.info(
                    "queue %s: the session's server process is not the one the driver "
                    "connected to (a pooler?): key slots are claimed per transaction",
                    self.name,
                )
            leases = info[_LEASES] = _Leases(_rendered(UNLEASE, connection)) if direct else False
        return leases if isinstance(leases, _Leases) else None

    def _receive_leasing(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        connection: Connection,
        count: int,
        gate: GlobalConcurrency | None,
        leases: _Leases,
    ) -> list[IncomingMessage] | None:
        """The receive (with the global slot), then leases of the keys not held yet.

        Leases of keys not in this batch are given back. None: a slot was refused; the rows
        are back in their places, every lease is given back and the careful path follows.
        """
        if gate is not None and gate.receives:
            taken = gate.receive(transport, queue, connection, count)
        else:
            if gate is not None and not gate.claim(connection):
                return []
            taken = transport.receive(queue, count, connection=connection)
        if not taken:
            return taken
        held = leases.held.get(self._prefix)
        if held is None:
            held = leases.held[self._prefix] = {}
        wanted = self._batch_keys(taken)
        if wanted == held.keys():  # the same keys as the batch before: nothing to claim
            return taken
        new = wanted.difference(held)
        if new and held and 2 * len(new) > len(wanted):
            # most keys of this batch are new to the worker: the next claims per transaction
            self._thread.folding = True
            self._thread.last_keys = wanted
        stale = held.keys() - wanted
        if stale:
            self._unlease(connection, leases, stale)
        if not new:
            return taken
        values = {
            "prefix": self._prefix,
            "k": self.limit,
            "first": _first_slot(self.limit),
            "names": json.dumps(list(new)),
        }
        try:
            rows = _rows(connection, LEASE, values)
            refused = False
            for name, slot in rows:
                if slot is None:
                    refused = True
                else:
                    held[name] = slot
        except BaseException:  # which were taken is not known: closing the connection frees all
            connection.invalidate()
            raise
        if not refused:
            return taken
        self._refused(transport, queue, connection, taken)
        self._unlease(connection, leases, None)
        return None

    def _unlease(
        self, connection: Connection, leases: _Leases, keys: Collection[str] | None
    ) -> None:
        """Give back the leases of *keys* (None: all) of this queue on *connection*."""
        held = leases.held.get(self._prefix)
        if not held:
            return
        names = list(held) if keys is None else keys
        values = _unlease_values(self._prefix, [(key, held[key]) for key in names])
        try:
            _rows(connection, UNLEASE, values)
            for key in names:
                del held[key]
        except BaseException:  # which were given back is not known: closing frees them all
            connection.invalidate()
            raise

    def _batch_keys(self, taken: list[IncomingMessage]) -> set[str]:
        """The keys of a batch's messages (once per batch on every worker).

        One set comprehension: measured cheaper than ``set(map(dict.get, ...))`` on a batch
        just received (5.5 against 6.3 us for 100 messages warm, 14 against 16 us cold).

        A message without the header, or whose headers could not be read (so are empty), has
        none.
        """
        header = self.header
        keys: set[str | None] = {message.headers.get(header) for message in taken}
        keys.discard(None)
        return cast("set[str]", keys)

    def _compare_keys(self, taken: list[IncomingMessage]) -> None:
        """Folding: lease again once two batches in a row share at least half their keys."""
        keys = self._batch_keys(taken)
        last = self._thread.__dict__.get("last_keys")
        self._thread.last_keys = keys
        if keys and last is not None and 2 * len(keys & last) >= len(keys):
            self._thread.folding = False

    def _receive_claiming(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        connection: Connection,
        count: int,
        gate: GlobalConcurrency | None,
    ) -> tuple[list[IncomingMessage], bool]:
        """The receive and its slots in one statement (:data:`RECEIVE_CLAIMING`).

        :returns: the messages, and whether every slot was taken (if not, the caller puts
            them back and takes the careful path).
        """
        assert self._fold is not None
        limit = self.limit if gate is None else max(self.limit, gate.limit)
        values = {
            **self._fold_values,
            "first": _first_slot(limit),
            "gname": "" if gate is None else gate.lock_name,
            "gk": 0 if gate is None else gate.limit,
        }
        taken, columns = transport.receive_returning(queue, count, connection, self._fold, values)
        if not taken:
            return taken, True
        keys, claims, global_claims = columns
        if global_claims[0] is False:  # the global slot (one claim for the statement)
            return taken, False
        missed: set[str] = set()
        header = self.header
        for message, found, claimed in zip(taken, keys, claims, strict=True):
            # as key_of, inline (once per message of a batch)
            if message.headers_error is not None or (key := message.headers.get(header)) is None:
                continue  # not limited (a lock taken for a misread key only restricts)
            if found == key:
                if not claimed:
                    return taken, False
            else:  # read otherwise in SQL: claim the key as parsed
                missed.add(key)
        if missed and not _try_slots(connection, [(self._prefix, missed, self.limit)]):
            return taken, False
        return taken, True

    def _careful(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        connection: Connection,
        count: int,
    ) -> list[IncomingMessage]:
        """The scan: browse the oldest rows, take each by id with its key's slot."""
        table_queue = transport._table_queue(queue)
        taken: list[IncomingMessage] = []
        blocked: set[str] = set()
        seen = 0
        after: int | None = None
        page = max(MIN_KEY_PAGE, 2 * count)
        self._thread.busy = False
        while len(taken) < count and seen < self.window:
            candidates = transport.browse(
                queue, min(page, self.window - seen), connection, after=after
            )
            if not candidates:
                break
            seen += len(candidates)
            after = candidates[-1].row_version
            for candidate in candidates:
                if len(taken) >= count:
                    break
                key = self.key_of(candidate)
                if key is not None and key in blocked:
                    continue
                savepoint = connection.begin_nested()
                message = table_queue.receive_by_id(connection, candidate.id)
                if message is None:  # another receiver has it (or took it already)
                    savepoint.rollback()
                    if key is not None and self.fifo:
                        blocked.add(key)
                    continue
                if key is not None and not self._claim(connection, key):
                    savepoint.rollback()  # the row returns to its place
                    blocked.add(key)
                    continue
                savepoint.commit()
                taken.append(message)
        if not taken and blocked:
            log.debug("queue %s: every waiting key is at its limit", self.name)
            self._thread.busy = True
        return taken

    def _claim(self, connection: Connection, key: str) -> bool:
        if self._statement is not None:
            return _try_slot(connection, self._statement, self.limit, self._lock_name(key))
        with self._counts_lock:  # SQLite: this process's count, released by release()
            if self._counts.get(key, 0) >= self.limit:
                return False
            self._counts[key] = self._counts.get(key, 0) + 1
        held = getattr(self._thread, "held", None)
        if held is None:
            held = self._thread.held = []
        held.append(key)
        return True

    def _lock_name(self, key: str) -> str:
        return self._prefix + key

    def release(self) -> None:
        """Give back the key slots this thread took (SQLite); back off if all keys were busy.

        The back-off (5 to 20 ms) keeps the pump from spinning on a queue whose every waiting
        key is at its limit.
        """
        state = self._thread.__dict__
        held = state.get("held")
        if held:
            with self._counts_lock:
                for key in held:
                    self._counts[key] -= 1
                    if not self._counts[key]:
                        del self._counts[key]
            held.clear()
        if state.get("busy"):
            state["busy"] = False
            time.sleep(random.uniform(0.005, 0.02))  # noqa: S311  (jitter, not secrets)


# -- the rate limit -------------------------------------------------------------------------
#: The schedules of the rate limits (PostgreSQL, SQL Server): one row per queue, found by its
#: primary key, so the check costs the same however long the queue has run. Declared once, in
#: :mod:`sqlqueue_orm.models.rate_limit` (revision ``0012_rate_limits``).
RATE_TABLE = rate_limit.rate_limit_table()

#: Reserve the next ``:step`` seconds of the schedule ``:name`` (``n / rate``), at most
#: ``:wait`` seconds ahead, ``:tau`` (``(burst - 1) / rate``) of idle time usable at once: the
#: seconds until the reserved start (0 or less: now), or no row / NULL when none is that close.
#: One short transaction of its own; the row lock is never held through a handler.
RESERVE: Final[dict[str, str]] = {
    # The clock is read before the row lock is granted: a caller that waited reserves after
    # the one it waited for (next_at only grows) and sleeps a little longer than it needs.
    "postgresql": (
        "WITH now AS (SELECT EXTRACT(EPOCH FROM clock_timestamp()) AS t) "
        "UPDATE {table} SET next_at = GREATEST(next_at, (SELECT t FROM now) - "
        "CAST(:tau AS float8)) + CAST(:step AS float8) "
        "WHERE name = :name AND GREATEST(next_at, (SELECT t FROM now) - CAST(:tau AS float8)) "
        "- (SELECT t FROM now) <= CAST(:wait AS float8) "
        "RETURNING next_at - CAST(:step AS float8) - (SELECT t FROM now)"
    ),
    # The row is locked first, the clock read after.
    "mssql": (
        "SET NOCOUNT ON; "
        "DECLARE @tau float = :tau, @step float = :step, @wait float = :wait, @next float, "
        "@now float, @slot float; "
        "SELECT @next = next_at FROM {table} WITH (UPDLOCK, ROWLOCK) WHERE name = :name; "
        "SET @now = DATEDIFF_BIG(microsecond, '19700101', SYSUTCDATETIME()) / 1e6; "
        "SET @slot = CASE WHEN @next > @now - @tau THEN @next ELSE @now - @tau END; "
        "IF @slot - @now <= @wait "
        "UPDATE {table} SET next_at = @slot + @step WHERE name = :name; "
        "ELSE SET @slot = NULL; "
        "SELECT @slot - @now;"
    ),
}


#: Dialects whose :data:`RESERVE` is one statement, atomic alone: run in autocommit.
RESERVE_ALONE: Final = frozenset({"postgresql"})

#: Longest stretch of the schedule one reservation of a block covers.
BLOCK_SPAN = 0.02
#: How long a block's starts stay usable once it is usable; the rest are then dropped.
BLOCK_LIFE = 0.1
#: Most starts one reservation takes for the process (one message each): a batched pump far
#: below a high rate reserves once per many batches (at 1,000,000/s: 10,000 starts, 100 batches).
MAX_BLOCK = 10_000


class RateLimit:
    """At most *rate* messages per *interval* seconds from one queue, across processes.

    A shared schedule (the generic cell rate algorithm, GCRA): each receive reserves the next
    free start time, ``1 / rate`` after the previous one, and sleeps until it; a queue idle for
    a while may start *burst* messages at once. So any window of one interval holds at most
    *rate* + *burst* starts. A reservation is made at most :data:`SLOT_WAIT` seconds ahead;
    beyond, the receive gives up (its message returns to the queue) and tries again.
    PostgreSQL and SQL Server: one row of ``sqlqueue_rate_limits`` per queue, created at
    start-up; SQLite: within this process.

    **Blocks** (PostgreSQL, SQL Server, a rate of 100 per second or more): one reservation
    takes the next :attr:`block` starts for this process (at most :data:`MAX_BLOCK`, covering
    at most :data:`BLOCK_SPAN` of the schedule, or a batch's size if more); its workers take
    them one by one, each sleeping until its start, and a batch as many as it may receive, up
    to what the block has left (it sleeps until the first and starts them together, as a batch
    reserved alone does). A process holds one block at a time: its
    starts not taken within :data:`BLOCK_LIFE` of the block becoming usable, or when a worker
    reserves the next block, are dropped (under-delivery, never over). A start taken late may
    bunch with later ones, so a window of one interval holds at most *rate* + *burst* starts
    plus, per process, the block less one (and never more than *rate* x :data:`BLOCK_LIFE`).
    """

    def __init__(
        self, engine: Engine, name: str, rate: int, interval: float, burst: int
    ) -> None:
        self.engine = engine
        self.name = name
        self.per_second = rate / interval
        self._step = 1 / self.per_second  # seconds between two starts
        self.burst = burst
        self.local = dialects.for_dialect(engine).single_writer
        self._lock = threading.Lock()
        self._next_at = 0.0
        #: Starts one reservation takes for single messages (1: no blocks).
        self.block = 1 if self.local else max(
            1, min(MAX_BLOCK, int(self.per_second * BLOCK_SPAN))
        )
        # the block being used: next start (epoch seconds), starts left, used until
        self._block_next = 0.0
        self._block_left = 0
        self._block_until = 0.0
        self._statement: sa.TextClause | None = None
        if not self.local:
            table = engine.dialect.identifier_preparer.format_table(RATE_TABLE)
            self._statement = sa.text(RESERVE[engine.dialect.name].format(table=table))

    def prepare(self) -> None:
        """Create the schedule's table and row if missing (PostgreSQL, SQL Server)."""
        if self.local:
            return
        try:
            RATE_TABLE.create(self.engine, checkfirst=True)
        except sa.exc.DBAPIError:
            # another process created it between the check and the CREATE
            if not sa.inspect(self.engine).has_table(RATE_TABLE.name):
                raise
        with self.engine.begin() as connection:
            found = connection.execute(
                sa.select(RATE_TABLE.c.name).where(RATE_TABLE.c.name == self.name)
            ).first()
            if found is None:
                try:
                    with connection.begin_nested():
                        connection.execute(
                            RATE_TABLE.insert().values(name=self.name, next_at=0.0)
                        )
                except sa.exc.IntegrityError:
                    pass  # another process created it first

    def take(self, wanted: int) -> int:
        """Reserve up to *wanted* messages' starts and sleep until the first.

        :returns: how many were reserved (a batch from a block may get fewer), 0 if none is
            near.
        """
        if self.block > 1:
            return self._take_from_block(wanted)
        wait = self._reserve(wanted)
        if wait is None:
            time.sleep(random.uniform(0.01, 0.05))  # noqa: S311  (jitter, not secrets)
            return 0
        if wait > 0:
            time.sleep(wait)
        return wanted

    def _take_from_block(self, wanted: int) -> int:
        """Up to *wanted* starts of the process's block.

        A new block is reserved when it is used up or too old: at least :attr:`block` starts,
        or *wanted* if more.
        """
        with self._lock:
            now = time.time()
            if not self._block_left or now > self._block_until:
                size = max(self.block, wanted)
                wait = self._reserve(size)  # under the lock: one reservation at a time
                if wait is None:
                    self._block_left = 0
                    start = None
                else:
                    now = time.time()  # (after the round trip)
                    start = now + wait
                    # usable for BLOCK_LIFE from when it is first usable (a start in the
                    # past is idle credit, the burst)
                    self._block_until = max(start, now) + BLOCK_LIFE
                    self._block_next = start
                    self._block_left = size
            else:
                start = self._block_next
            granted = 0 if start is None else min(wanted, self._block_left)
            self._block_next += granted * self._step
            self._block_left -= granted
        if start is None:
            time.sleep(random.uniform(0.01, 0.05))  # noqa: S311  (jitter, not secrets)
            return 0
        if start > now:  # else the start had passed at the clock read under the lock: no sleep
            wait = start - time.time()
            if wait > 0:
                time.sleep(wait)
        return granted

    def _reserve(self, wanted: int) -> float | None:
        step = wanted / self.per_second
        tau = (self.burst - 1) / self.per_second  # an idle queue starts *burst* at once
        if self._statement is None:
            with self._lock:
                now = time.time()
                start = max(self._next_at, now - tau)
                if start - now > SLOT_WAIT:
                    return None
                self._next_at = start + step
                return start - now
        values = {"name": self.name, "step": step, "tau": tau, "wait": SLOT_WAIT}
        if self.engine.dialect.name in RESERVE_ALONE:
            # one UPDATE, atomic alone: no BEGIN and COMMIT round trips (every worker's take
            # waits for this lock while a reservation runs)
            autocommit = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            with autocommit as connection:
                value = connection.execute(self._statement, values).scalar()
        else:
            with self.engine.begin() as connection:
                value = connection.execute(self._statement, values).scalar()
        return None if value is None else float(value)
