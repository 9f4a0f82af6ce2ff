"""Endpoint health and queue metrics: the heartbeats and samples endpoints write, and their reading.

A running endpoint's health thread (:mod:`sqlqueue_orm.receiving.health`) writes through this
module: a heartbeat row per instance in ``sqlqueue_endpoints`` every few seconds, and about once
a minute one sample per queue it consumes in ``sqlqueue_queue_metrics`` (the tables are
described in :mod:`sqlqueue_orm.models.endpoint_health`). ``sqlqueue endpoints`` and the
dashboard read them back with :func:`read_endpoints` and :func:`read_queue_metrics`, so what they
show survives a restart of the reader and of the writers.

Every write is a short transaction of its own, one row by its primary key or a few inserts:
each instance writes only its own rows (its instance id is in their key), so two writers never
touch the same row and no upsert is needed. An instance is **running** while its beats arrive,
**stale** once :data:`STALE_BEATS` beats in a row are missing (killed, hung, cut off from the
database), **stopped** when it stopped cleanly. Rows older than :data:`RETENTION` are deleted by
any writer (:func:`prune`), each every ten minutes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import config, db, dialects, headers
from sqlqueue_orm.models import endpoint_health
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.queuing import sql

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect, Engine

    from sqlqueue_orm.addressing import QueueAddress
    from sqlqueue_orm.connections import ThreadConnections
    from sqlqueue_orm.ops_connection import OpsConnection
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Heartbeats of every endpoint instance (one row each).
ENDPOINTS = endpoint_health.endpoints_table()
#: Samples of every queue (one row per queue, instance and sample).
METRICS = endpoint_health.metrics_table()
#: Missed beats after which a running instance is shown as stale.
STALE_BEATS = 3
#: Seconds rows are kept: a day of samples; heartbeats a day after their last beat.
RETENTION = 24 * 3600.0
#: Seconds between samples of one queue by one instance.
SAMPLE_INTERVAL = 60.0
#: Seconds of beats an instance's rates are measured over, and the least they are shown over.
RATE_WINDOW = 60.0
#: Seconds between one writer's prunings of rows older than :data:`RETENTION`.
PRUNE_INTERVAL = 600.0
#: Queue names one read of the samples asks for at most.
MAX_NAMES = 500
#: The states of an instance as read.
RUNNING, STALE, STOPPED = config.RUNNING, config.STALE, config.STOPPED


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """What one beat of an endpoint instance writes."""

    instance_id: str
    endpoint: str
    host: str
    process_id: int
    started_at: float
    beat_interval: float
    concurrency: int
    in_flight: int
    processed: int
    failed: int
    #: Messages processed (failed) per minute over the beats of the last minute before it.
    processed_rate: float
    failed_rate: float


@dataclasses.dataclass(frozen=True)
class EndpointInstance(Heartbeat):
    """One endpoint instance as read back: its last beat and what that makes it now.

    A flat record: the beat's fields, then what the reader adds beside them.
    """

    #: ``running``, ``stale`` (no beat for :attr:`silent_for` seconds) or ``stopped``.
    state: str
    last_seen: float
    #: Seconds since the last beat (by the reader's clock).
    silent_for: float

    @property
    def rated(self) -> bool:
        """Whether its rates cover a whole :data:`RATE_WINDOW` of beats.

        An instance that beat for less (a ``--once`` run, a fresh start) has rates over the
        fraction of a minute it ran, which would claim a pace it never kept: show its counts.
        """
        return self.last_seen - self.started_at >= RATE_WINDOW

    @property
    def state_text(self) -> str:
        """``running``, ``stale for 12 min`` (silent that long) or ``stopped 3 min ago``."""
        silent = format_duration(self.silent_for)
        if self.state == STALE:
            return f"stale for {silent}"
        if self.state == STOPPED:
            return f"stopped {silent} ago"
        return self.state

    def record(self) -> dict[str, Any]:
        """The instance as a JSON-ready mapping (times in ISO 8601, UTC)."""
        values = dataclasses.asdict(self)
        for key in ("started_at", "last_seen"):
            values[key] = _iso(values[key])
        values["silent_for"] = round(self.silent_for, 1)
        return values


@dataclasses.dataclass(frozen=True)
class QueueSample:
    """A queue at one minute: depth and oldest message (latest reading), work summed."""

    at: float
    depth: int | None
    oldest_age: float | None
    processed: int
    failed: int


@dataclasses.dataclass(frozen=True)
class QueueMetrics:
    """A queue's samples over a window, one per minute, oldest first."""

    queue: str
    samples: Sequence[QueueSample]

    @property
    def latest(self) -> QueueSample | None:
        """The newest minute's sample (``None``: none in the window)."""
        return self.samples[-1] if self.samples else None

    def per_minute(self, field: str, minutes: int = 5, now: float | None = None) -> float | None:
        """*field* (``processed`` or ``failed``) per minute over the *minutes* before *now*.

        What the samples of those minutes count, divided by their number: every message an
        endpoint handles is in one of its samples, so minutes without one had none, and an old
        minute or a run of a fraction of a second is not taken for the pace of every minute.
        ``None``: no sample at all.
        """
        if not self.samples:
            return None
        since = (time.time() if now is None else now) - minutes * 60.0
        total: int = sum(getattr(sample, field) for sample in self.samples if sample.at > since)
        return total / minutes


def _iso(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, dt.UTC).isoformat(timespec="seconds")


# -- writing ------------------------------------------------------------------------------------
def create_tables(engine: Engine) -> None:
    """Create both tables if missing (another process creating them at once is fine)."""
    for table in (ENDPOINTS, METRICS):
        try:
            table.create(engine, checkfirst=True)
        except sa.exc.DBAPIError:
            # another process created it between the check and the CREATE
            if not sa.inspect(engine).has_table(table.name):
                raise


def beat_statement(dialect: Dialect) -> sql.Statement:
    """The heartbeat's UPDATE of its instance's row by key, rendered for *dialect*'s driver.

    One statement, atomic alone: run in autocommit, it holds SQLite's write lock only while it
    runs, not from a BEGIN IMMEDIATE through a COMMIT a Python thread may be slow to reach.
    """
    preparer = dialect.identifier_preparer
    columns = [column.name for column in ENDPOINTS.columns if column.name != "instance_id"]
    assignments = ", ".join(f"{preparer.quote(name)} = :{name}" for name in columns)
    template = f"UPDATE {{table}} SET {assignments} WHERE instance_id = :instance_id"
    return sql.render(template, dialect, preparer.format_table(ENDPOINTS))


def beat(
    engine: Engine,
    heartbeat: Heartbeat,
    *,
    state: str = RUNNING,
    alone: ThreadConnections | OpsConnection | None = None,
) -> None:
    """Write *heartbeat* as its instance's row, now: one UPDATE by key (INSERT the first time).

    :param alone: connections of the writer's own (not the transport's, whose kept ones are
        the pump's) to run the UPDATE on as one statement in autocommit
        (:meth:`ThreadConnections.statement`); ``None``: in a transaction of the engine.
    """
    values = dataclasses.asdict(heartbeat)
    values.update(state=state, last_seen=time.time())
    if alone is not None and not alone.observed():
        statement = beat_statement(engine.dialect)
        with alone.statement() as cursor:
            cursor.execute(statement.text, statement.params(values))
            updated = cursor.rowcount
        if updated:
            return
    instance_id = values.pop("instance_id")
    with engine.begin() as connection:
        updated = connection.execute(
            ENDPOINTS.update().where(ENDPOINTS.c.instance_id == instance_id).values(**values)
        ).rowcount
        if not updated:  # the first beat, or the row was pruned while the instance hung
            connection.execute(ENDPOINTS.insert().values(instance_id=instance_id, **values))


def write_samples(
    engine: Engine,
    instance_id: str,
    samples: Iterable[tuple[str, QueueSample]],
    *,
    alone: ThreadConnections | OpsConnection | None = None,
) -> None:
    """Insert one sample per ``(queue, sample)`` of *samples*, all or none.

    :param alone: connections of the writer's own to run ONE multi-row INSERT on, alone in
        autocommit (atomic as one statement; on SQLite it holds the write lock only while it
        runs, no BEGIN IMMEDIATE before it); ``None``: a transaction of the engine.
    """
    rows = [
        {
            "queue": queue,
            "sampled_at": sample.at,
            "instance_id": instance_id,
            "depth": sample.depth,
            "oldest_age": sample.oldest_age,
            "processed": sample.processed,
            "failed": sample.failed,
        }
        for queue, sample in samples
        if len(queue) <= endpoint_health.QUEUE_LENGTH
    ]
    if not rows:
        return
    if alone is not None and not alone.observed():
        statement = samples_statement(engine.dialect, len(rows))
        values = {
            f"{name}_{_row_tag(index)}": value
            for index, row in enumerate(rows)
            for name, value in row.items()
        }
        with alone.statement() as cursor:
            cursor.execute(statement.text, statement.params(values))
        return
    with engine.begin() as connection:
        connection.execute(METRICS.insert(), rows)


#: The columns a sample row writes, in the order of :func:`samples_statement`.
_SAMPLE_COLUMNS = (
    "queue",
    "sampled_at",
    "instance_id",
    "depth",
    "oldest_age",
    "processed",
    "failed",
)


def _row_tag(index: int) -> str:
    """Row *index* as letters (``a``, ``b``, ... ``ba``): parameter names take no digits."""
    tag = ""
    while True:
        index, digit = divmod(index, 26)
        tag = chr(ord("a") + digit) + tag
        if not index:
            return tag


@functools.lru_cache(maxsize=16)
def samples_statement(dialect: Dialect, count: int) -> sql.Statement:
    """One INSERT of *count* sample rows (parameters ``queue_a``, ``sampled_at_a``, ...)."""
    preparer = dialect.identifier_preparer
    columns = ", ".join(preparer.quote(name) for name in _SAMPLE_COLUMNS)
    tuples = ", ".join(
        "(" + ", ".join(f":{name}_{_row_tag(index)}" for name in _SAMPLE_COLUMNS) + ")"
        for index in range(count)
    )
    template = f"INSERT INTO {{table}} ({columns}) VALUES {tuples}"
    return sql.render(template, dialect, preparer.format_table(METRICS))


def prune(engine: Engine, now: float | None = None) -> None:
    """Delete samples and heartbeats older than :data:`RETENTION`."""
    cutoff = (time.time() if now is None else now) - RETENTION
    with engine.begin() as connection:
        connection.execute(METRICS.delete().where(METRICS.c.sampled_at < cutoff))
        connection.execute(ENDPOINTS.delete().where(ENDPOINTS.c.last_seen < cutoff))


class TableUpkeep:
    """What each writer of the health tables does around its writes, on its own thread.

    It creates the tables before the writer's first write, prunes rows older than
    :data:`RETENTION` every :data:`PRUNE_INTERVAL`, and logs a failing round of writes once
    per outage and the first one that works again: an error is not raised, the writer tries
    again at its next turn.

    :param logger: the writer's logger.
    :param failing: the warning when a round fails (the error follows it, after a colon).
    :param working: the warning when a round works again.
    """

    def __init__(self, logger: logging.Logger, failing: str, working: str) -> None:
        self.logger = logger
        self.failing = failing
        self.working = working
        self._tables_ready = False
        self._pruned = float("-inf")
        self._failing = False

    def run(self, engine: Engine, write: Callable[[], object]) -> None:
        """One round: make *engine*'s tables if not yet, then *write*; an error is logged."""
        try:
            if not self._tables_ready:
                create_tables(engine)
                self._tables_ready = True
            write()
        except Exception as error:
            if not self._failing:  # once per outage, not once per round
                self.logger.warning("%s: %s", self.failing, error)
            self._failing = True
            return
        if self._failing:
            self.logger.warning(self.working)
        self._failing = False

    def prune(self, engine: Engine) -> None:
        """:func:`prune` *engine*'s tables if this writer did not for :data:`PRUNE_INTERVAL`."""
        now = time.monotonic()
        if now - self._pruned >= PRUNE_INTERVAL:
            prune(engine)
            self._pruned = now


def read_head(
    transport: Transport, queue: str, alone: ThreadConnections | OpsConnection | None = None
) -> tuple[int, float | None]:
    """*queue*'s depth (the peek's estimate) and its oldest message's age (:func:`oldest_age`).

    :param alone: connections of the caller's own: the peek and the head-row read run on them,
        each alone in autocommit (one round trip each, no transaction around them). ``None``,
        or before the queue's layout was checked: on one connection of the pool that only
        reads (never one the pump's threads keep).
    """
    address = transport.queues.address(queue)
    table_queue = transport.queues.table_queue(queue)
    if alone is not None and not alone.observed() and table_queue.layout_known:
        dialect = transport.engine.dialect
        with db.wrap_db_errors(str(address)):
            with alone.statement() as cursor:
                depth = table_queue.peek_on_cursor(cursor)
            if depth <= 0:
                return 0, None
            with alone.statement() as cursor:
                cursor.execute(head_text(dialect, address))
                row = cursor.fetchone()
        return depth, _age(None if row is None else row[0], dialect)
    with db.wrap_db_errors(str(address)), db.reading(transport.engine) as connection:
        depth = transport.peek(queue, connection)
        if depth <= 0:
            return 0, None
        return depth, _oldest(connection, address)


def oldest_age(transport: Transport, queue: str) -> float | None:
    """Seconds the oldest message of *queue* has waited, from its ``NServiceBus.TimeSent``.

    The head row's Headers alone (.NET senders write TimeSent too): one row found through the
    queue's clustered key (:func:`head_statement`). ``None``: the queue is empty, or its head
    carries no readable TimeSent.
    """
    address = transport.queues.address(queue)
    with db.wrap_db_errors(str(address)), db.reading(transport.engine) as connection:
        return _oldest(connection, address)


def _oldest(connection: Connection, address: QueueAddress) -> float | None:
    raw = connection.execute(head_statement(connection.dialect, address)).scalar()
    return _age(raw, connection.dialect)


def _age(raw: Any, dialect: Dialect) -> float | None:
    """Seconds since the ``NServiceBus.TimeSent`` of the head row's raw Headers, if readable."""
    if raw is None:
        return None
    encoding = sql.for_dialect(dialect).headers_encoding
    parsed, _kept, _error = headers.decode(raw, encoding)
    sent = parsed.get(headers.TIME_SENT)
    if not sent:
        return None
    try:
        moment = headers.parse_time(sent)
    except ValueError:
        return None
    return max(0.0, time.time() - moment.timestamp())


def head_statement(dialect: Dialect, address: QueueAddress) -> sa.Select[Any]:
    """The Headers of the queue's head row: ``TOP 1``/``LIMIT 1`` by the clustered key.

    With the dialect's :attr:`~sqlqueue_orm.dialects.base.DialectSupport.committed_read_hint`
    (SQL Server: ``READPAST``), so a row being received or written is skipped, not waited for.
    """
    table = queue_table(address.table, db.schema_argument(address), dialect)
    text = sql.for_dialect(dialect)
    quoted = dialect.identifier_preparer.quote(table.c.Headers.name)
    statement: sa.Select[Any] = (
        sa.select(sa.literal_column(text.headers_read.format(headers=quoted)))
        .select_from(table)
        .order_by(table.c.RowVersion)
        .limit(1)
    )
    hint = dialects.for_dialect(dialect).committed_read_hint
    return statement if hint is None else statement.with_hint(table, hint)


@functools.lru_cache(maxsize=256)
def head_text(dialect: Dialect, address: QueueAddress) -> str:
    """:func:`head_statement` as driver SQL with no parameter (its row limit a literal)."""
    compiled = head_statement(dialect, address).compile(
        dialect=dialect, compile_kwargs={"literal_binds": True}
    )
    return str(compiled)


# -- reading -------------------------------------------------------------------------------------
def _has(connection: Connection, table: sa.Table) -> bool:
    return sa.inspect(connection).has_table(table.name)


def read_endpoints(engine: Engine, now: float | None = None) -> list[EndpointInstance]:
    """Every endpoint instance that beat in the last day, by endpoint, then newest first."""
    moment = time.time() if now is None else now
    with db.wrap_db_errors(), db.reading(engine) as connection:
        if not _has(connection, ENDPOINTS):
            return []
        rows = connection.execute(
            sa.select(ENDPOINTS).order_by(ENDPOINTS.c.endpoint, ENDPOINTS.c.started_at.desc())
        ).all()
    found = []
    for row in rows:
        silent = max(0.0, moment - row.last_seen)
        state = row.state
        if state == RUNNING and silent > STALE_BEATS * row.beat_interval:
            state = STALE
        found.append(
            EndpointInstance(
                endpoint=row.endpoint,
                instance_id=row.instance_id,
                host=row.host,
                process_id=row.process_id,
                state=state,
                started_at=row.started_at,
                last_seen=row.last_seen,
                beat_interval=row.beat_interval,
                concurrency=row.concurrency,
                in_flight=row.in_flight,
                processed=row.processed,
                failed=row.failed,
                processed_rate=row.processed_rate,
                failed_rate=row.failed_rate,
                silent_for=silent,
            )
        )
    return found


def read_queue_metrics(
    engine: Engine, queues: Sequence[str], window: float = RETENTION, now: float | None = None
) -> dict[str, QueueMetrics]:
    """The samples of *queues* over the last *window* seconds, merged per minute.

    Within one minute, processed and failed are summed over the instances' samples; depth and
    oldest age are the latest reading's.
    """
    since = (time.time() if now is None else now) - window
    found: dict[str, dict[int, list[Any]]] = {queue: {} for queue in queues}
    rows: list[Any] = []
    with db.wrap_db_errors(), db.reading(engine) as connection:
        if queues and _has(connection, METRICS):
            names = list(dict.fromkeys(queues))
            for start in range(0, len(names), MAX_NAMES):  # SQL Server: 2,100 parameters
                rows.extend(
                    connection.execute(
                        sa.select(METRICS)
                        .where(
                            METRICS.c.queue.in_(names[start : start + MAX_NAMES]),
                            METRICS.c.sampled_at >= since,
                        )
                        .order_by(METRICS.c.queue, METRICS.c.sampled_at)
                    ).all()
                )
    for row in rows:
        minutes = found[row.queue]
        minute = int(row.sampled_at // 60)
        merged = minutes.setdefault(minute, [row.sampled_at, None, None, 0, 0])
        merged[0] = row.sampled_at
        if row.depth is not None:  # the latest reading of the minute wins (rows come in order)
            merged[1], merged[2] = row.depth, row.oldest_age
        merged[3] += row.processed
        merged[4] += row.failed
    return {
        queue: QueueMetrics(
            queue,
            [
                QueueSample(at, depth, oldest, processed, failed)
                for _minute, (at, depth, oldest, processed, failed) in sorted(minutes.items())
            ],
        )
        for queue, minutes in found.items()
    }


def format_duration(seconds: float) -> str:
    """*seconds* as an operator reads it: ``40 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``."""
    whole = int(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min"
    if whole < 2 * 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"
