"""Failure groups: the failed messages of an error queue that are the same failure.

::

    groups = FailureGroups(ErrorQueue(transport))
    for group in groups.list():                   # by exception type and stack trace
        print(group.id, group.count, group.label, group.first_failure, group.last_failure)
    groups.retry(group.id)                        # each message back to its queue, once

Three groupings, as ServicePulse offers them (:data:`GROUPINGS`):

* ``type`` (the default): ``NServiceBus.ExceptionInfo.ExceptionType`` plus a fingerprint of
  ``NServiceBus.ExceptionInfo.StackTrace`` with what varies between occurrences of one failure
  removed (:func:`stack_fingerprint`): only the frames are kept (the exception's message, the
  source lines and the ``During handling...`` text are dropped), each frame as the function (and,
  for Python, the file's name without its folder), without line numbers, memory addresses
  (``0x7f...``) or the numbers .NET gives compiler-generated methods and classes
  (``<Handle>b__0_1``, ``<>c__DisplayClass12_0``). Two
  messages that failed with the same exception at the same place group together whatever their
  message text, ids or the machine's install folder; a redeploy that only moves lines keeps the
  group;
* ``endpoint``: ``NServiceBus.ProcessingEndpoint``;
* ``message-type``: the first type of ``NServiceBus.EnclosedMessageTypes``, without its assembly
  part (``Sales.PlaceOrder, Sales, Version=1.0.0.0`` groups as ``Sales.PlaceOrder``).

A group's id is a short hash of its grouping and key (:func:`group_id`): the same while any of its
messages exists, on any machine, whatever else comes and goes. Rows written by .NET endpoints
group the same way (their ``HelpLink`` and other headers may be JSON ``null``); a row whose
headers cannot be read groups under ``(headers cannot be read)``.

Keys are computed once per message, in Python (:mod:`sqlqueue_orm.models.failure_keys`), and
kept in ``sqlqueue_failure_groups`` (:mod:`sqlqueue_orm.models.failure_group`). Our endpoints
write a message's entry as they move it to the error queue; each listing first counts, in one
statement, the queue's rows, the entries and their pairs, and only when these differ adds the
entries of the messages that have none (the queue's ids and the entries' compared as sets, so
rows whose identity committed late are not missed, as they would be after a "highest
``RowVersion`` seen") and deletes those whose message is gone; counting is then a ``GROUP BY``
of the entries in SQL. :meth:`FailureGroups.retry` and :meth:`FailureGroups.delete` take
the group's messages as they are at that moment and hand them to :meth:`ErrorQueue.retry` /
:meth:`ErrorQueue.delete`: one transaction per message, so two operators retrying one group send
each message once.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import db, exceptions
from sqlqueue_orm.models import failure_group, failure_keys
from sqlqueue_orm.models.failure_keys import (
    NONE_LABEL,
    UNREADABLE_LABEL,
    ensure_table,
    group_id,
    message_type,
    stack_fingerprint,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue


def entry(queue: str, message: IncomingMessage) -> dict[str, Any]:
    """The side-table row of *message* of error queue *queue* (its address as text)."""
    found = None if message.headers_error is not None else message.headers
    return failure_keys.entry(queue, message.id, message.message_id, found)


log = logging.getLogger(__name__)

#: The groupings, by the name the CLI and the dashboard use, and the column of each.
GROUPINGS = {
    "type": "stack_group",
    "endpoint": "endpoint_group",
    "message-type": "message_type_group",
}
#: The label of the column of each grouping.
_LABELS = {"type": "stack_label", "endpoint": "endpoint", "message-type": "message_type"}
#: Rows fingerprinted per transaction while filling the side table.
_FILL_BATCH = 2000
#: Seconds between two progress lines of a long fill.
_PROGRESS_EVERY = 5.0

__all__ = [
    "GROUPINGS",
    "NONE_LABEL",
    "UNREADABLE_LABEL",
    "FailureGroup",
    "FailureGroups",
    "ensure_table",
    "entry",
    "group_id",
    "message_type",
    "stack_fingerprint",
]
TABLE = failure_keys.TABLE
_TEXT = sa.String(36)
_ID_PATTERN = re.compile(f"[0-9a-f]{{{failure_group.GROUP_LENGTH}}}")


@dataclasses.dataclass(frozen=True)
class FailureGroup:
    """One group of failed messages."""

    #: The group's id (:func:`group_id`): what ``retry`` and ``delete`` take.
    id: str
    #: ``type``, ``endpoint`` or ``message-type``.
    by: str
    #: What the group's messages share: ``Type: innermost frame``, the endpoint, the type.
    label: str
    #: How many messages the group has now.
    count: int
    #: The earliest and latest ``NServiceBus.TimeOfFailure`` (UTC; None when none is readable).
    first_failure: dt.datetime | None
    last_failure: dt.datetime | None


def _aware(moment: Any) -> dt.datetime | None:
    if moment is None:
        return None
    if isinstance(moment, str):  # SQLite's MIN/MAX of a DATETIME column give its text
        moment = dt.datetime.fromisoformat(moment)
    assert isinstance(moment, dt.datetime)
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment


class FailureGroups:
    """The failure groups of one error queue.

    :param errors: the :class:`~sqlqueue_orm.recoverability.error_queue.ErrorQueue`.
    """

    def __init__(self, errors: ErrorQueue) -> None:
        self.errors = errors
        self.queue = str(errors.address)
        if len(self.queue) > failure_group.QUEUE_LENGTH:
            raise exceptions.ConfigurationError(
                f"error queue {errors.name!r}: failure groups take addresses of at most "
                f"{failure_group.QUEUE_LENGTH} characters"
            )

    def __repr__(self) -> str:
        return f"FailureGroups({self.errors.name!r})"

    # -- the side table ----------------------------------------------------------------------
    def refresh(self) -> int:
        """Add the entries of messages that have none, delete those of messages gone.

        Returns how many entries were added. Safe to run from several processes at once
        (an entry another one added first is skipped).

        One statement first counts the queue's rows, the entries and the pairs of both: when
        every row has an entry and every entry a row, nothing is read (the usual case: our
        endpoints write the entry as they move the message). Otherwise the two sets of ids are
        read and compared in Python: an anti-join in SQL would probe the queue's ``Id``, which
        has no index in NServiceBus's SQL Server layout nor on SQLite, and PostgreSQL's
        planner, misled by the statistics of a table that has just been filled, picks a nested
        loop over it; reading two columns of ids costs the same every time.
        """
        engine = self.errors.transport.engine
        ensure_table(engine)
        queue_table = self.errors.table()
        mine = TABLE.c.queue == self.queue
        with db.wrap_db_errors(self.queue):
            with engine.connect() as connection:
                if self._complete(connection, queue_table):
                    return 0
                # As text (32 hex digits, whatever form the database casts to): strings hash
                # and compare in C, uuid.UUID objects in Python.
                present = _hex(connection.execute(sa.select(sa.cast(queue_table.c.Id, _TEXT))))
                known = _hex(connection.execute(sa.select(sa.cast(TABLE.c.id, _TEXT)).where(mine)))
            missing = present - known
            added = self._fill(missing) if missing else 0
            stale = sorted(_uuid(each) for each in known - present)
            for start in range(0, len(stale), _FILL_BATCH):
                with engine.begin() as connection:
                    connection.execute(
                        sa.delete(TABLE).where(
                            mine, TABLE.c.id.in_(stale[start : start + _FILL_BATCH])
                        )
                    )
        return added

    def _complete(self, connection: Connection, queue_table: sa.Table) -> bool:
        """Whether every row of the queue has an entry and every entry a row (one statement).

        The pairs are counted twice: all of them (as many as rows: each row has an entry, the
        entries' key being unique) and their distinct entries (as many as entries: each entry
        has a row, even were two rows to share an ``Id``).
        """
        mine = TABLE.c.queue == self.queue
        pairs = (
            sa.select(
                sa.func.count().label("pairs"),
                sa.func.count(sa.distinct(TABLE.c.id)).label("matched"),
            )
            .select_from(queue_table.join(TABLE, sa.and_(mine, TABLE.c.id == queue_table.c.Id)))
            .subquery()
        )
        rows = sa.select(sa.func.count()).select_from(queue_table).scalar_subquery()
        entries = sa.select(sa.func.count()).select_from(TABLE).where(mine).scalar_subquery()
        found = connection.execute(sa.select(pairs.c.pairs, pairs.c.matched, rows, entries)).one()
        return int(found[0]) == int(found[2]) and int(found[1]) == int(found[3])

    def _fill(self, missing: set[str]) -> int:
        """Write the entries of the messages *missing* has (32 hex digits; gone ones skipped).

        A few are read by id; many in one pass over the queue in ``RowVersion`` order, a page
        at a time (only the headers), each page fingerprinted and inserted in one statement
        (the driver's many-rows insert), with a progress line naming the queue every few
        seconds.
        """
        engine = self.errors.transport.engine
        queue_table = self.errors.table()
        if len(missing) <= _FILL_BATCH:  # the usual case: a few new messages, found by id
            statement = self.errors.select_messages(body=False).where(
                queue_table.c.Id.in_(sorted(_uuid(each) for each in missing))
            )
            with engine.begin() as connection:
                rows = connection.execute(statement).all()
                entries = [entry(self.queue, self.errors.message_of(row)) for row in rows]
                return self._insert(connection, entries) if entries else 0
        log.info(
            "queue %s: grouping %d failed message(s) written by others",
            self.errors.name,
            len(missing),
        )
        added = seen = 0
        began = reported = time.monotonic()
        after: int | None = None  # many: one pass over the queue, a page at a time
        while True:
            statement = self.errors.select_messages(body=False)
            if after is not None:
                statement = statement.where(queue_table.c.RowVersion > after)
            statement = statement.order_by(queue_table.c.RowVersion).limit(_FILL_BATCH)
            with engine.begin() as connection:
                rows = connection.execute(statement).all()
                entries = [
                    entry(self.queue, self.errors.message_of(row))
                    for row in rows
                    if str(row[0]).replace("-", "").lower() in missing
                ]
                if entries:
                    added += self._insert(connection, entries)
            seen += len(rows)
            if len(rows) < _FILL_BATCH:
                log.info(
                    "queue %s: grouped %d failed message(s) in %.1f s",
                    self.errors.name,
                    added,
                    time.monotonic() - began,
                )
                return added
            after = int(rows[-1][1])
            if time.monotonic() - reported >= _PROGRESS_EVERY:
                reported = time.monotonic()
                log.info(
                    "queue %s: grouping failed messages: %d added, %d row(s) read",
                    self.errors.name,
                    added,
                    seen,
                )

    def _insert(self, connection: Connection, entries: list[dict[str, Any]]) -> int:
        """Insert *entries*; one another process inserted first is skipped.

        One ``executemany`` of the statement compiled once: the driver's many-rows path (psycopg
        3 pipelines the rows). Not ``RETURNING`` (SQLAlchemy's "insertmanyvalues" pages of
        ``VALUES (...), (...)``): psycopg converts each page's long text anew, which costs more
        than the pipeline saves; nor one ``insert().values([...])`` per page: compiled anew
        each time.
        """
        savepoint = connection.begin_nested()
        try:
            connection.execute(sa.insert(TABLE), entries)
        except sa.exc.IntegrityError:
            savepoint.rollback()
        else:
            savepoint.commit()
            return len(entries)
        inserted = 0
        for each in entries:  # someone else is filling too: one at a time, skipping theirs
            savepoint = connection.begin_nested()
            try:
                connection.execute(sa.insert(TABLE), [each])
            except sa.exc.IntegrityError:
                savepoint.rollback()
            else:
                savepoint.commit()
                inserted += 1
        return inserted

    # -- reading -----------------------------------------------------------------------------
    def list(self, by: str = "type") -> list[FailureGroup]:
        """The groups of grouping *by*, largest first (then by label).

        :raises ConfigurationError: *by* is not one of :data:`GROUPINGS`.
        """
        column = _grouping(by)
        self.refresh()  # the entries are now those of the queue's messages: no join needed
        return self._counted(by, column)

    def _counted(self, by: str, column: str) -> builtins.list[FailureGroup]:
        """The groups of grouping *by* (its column *column*) as the entries count them."""
        key = TABLE.c[column]
        statement = (
            sa.select(
                key,
                sa.func.count(),
                sa.func.min(TABLE.c.failed_at),
                sa.func.max(TABLE.c.failed_at),
                sa.func.max(TABLE.c[_LABELS[by]]),
            )
            .where(TABLE.c.queue == self.queue)
            .group_by(key)
        )
        with db.wrap_db_errors(self.queue), self.errors.transport.engine.connect() as conn:
            rows = conn.execute(statement).all()
        found = [
            FailureGroup(
                id=str(row[0]),
                by=by,
                label=row[4] or NONE_LABEL,
                count=int(row[1]),
                first_failure=_aware(row[2]),
                last_failure=_aware(row[3]),
            )
            for row in rows
        ]
        found.sort(key=lambda group: (-group.count, group.label, group.id))
        return found

    def get(self, id: str) -> FailureGroup:
        """The group whose id is *id*, whichever grouping made it.

        :raises ConfigurationError: naming *id* when no group has it.
        """
        wanted = _checked(id, self.errors.name)
        self.refresh()
        for by, column in GROUPINGS.items():
            for group in self._counted(by, column):
                if group.id == wanted:
                    return group
        raise _unknown(id, self.errors.name)

    def ids(self, id: str) -> tuple[str, ...]:
        """The row ids of the messages of group *id* now, oldest first.

        :raises ConfigurationError: naming *id* when no message of the queue is in that group.
        """
        wanted = _checked(id, self.errors.name)
        self.refresh()
        queue_table = self.errors.table()
        statement = (
            sa.select(queue_table.c.Id)
            .select_from(
                queue_table.join(
                    TABLE, sa.and_(TABLE.c.queue == self.queue, TABLE.c.id == queue_table.c.Id)
                )
            )
            .where(
                TABLE.c.queue == self.queue,
                sa.or_(*(TABLE.c[column] == wanted for column in GROUPINGS.values())),
            )
            .order_by(queue_table.c.RowVersion)
        )
        with db.wrap_db_errors(self.queue), self.errors.transport.engine.connect() as conn:
            found = tuple(str(_uuid(row[0])) for row in conn.execute(statement))
        if not found:
            raise _unknown(id, self.errors.name)
        return found

    # -- changing ----------------------------------------------------------------------------
    def retry(self, id: str) -> int:
        """:meth:`ErrorQueue.retry` every message of group *id*; return how many were sent."""
        return self._change(id, self.errors.retry, "sent back")

    def delete(self, id: str) -> int:
        """:meth:`ErrorQueue.delete` every message of group *id*; return how many were deleted."""
        return self._change(id, self.errors.delete, "deleted")

    def _change(self, id: str, change: Callable[[tuple[str, ...]], int], done: str) -> int:
        """Apply *change* to the messages of group *id*, log it as *done*, refresh the groups.

        The refresh drops the entries of the messages that left the error queue.
        """
        chosen = self.ids(id)
        changed = change(chosen)
        log.info(
            "queue %s: failure group %s: %d of %d message(s) %s",
            self.errors.name,
            id,
            changed,
            len(chosen),
            done,
        )
        self.refresh()
        return changed


def _hex(result: sa.Result[Any]) -> set[str]:
    """The ids of a one-column result of text ids, as 32 lower-case hex digits.

    An id that is not a UUID (a poison row moved as it was stored) is left out: no entry can
    name it.
    """
    found = set()
    for value in result.scalars():
        digits = str(value).replace("-", "").lower()
        if len(digits) == 32 and digits.isascii() and digits.isalnum():
            try:
                int(digits, 16)
            except ValueError:
                continue
            found.add(digits)
    return found


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _grouping(by: str) -> str:
    try:
        return GROUPINGS[by]
    except KeyError:
        raise exceptions.ConfigurationError(
            f"grouping {by!r} must be one of: {', '.join(GROUPINGS)}"
        ) from None


def _checked(id: str, queue: str) -> str:
    wanted = str(id).strip().lower()
    if _ID_PATTERN.fullmatch(wanted) is None:
        raise _unknown(id, queue)
    return wanted


def _unknown(id: str, queue: str) -> exceptions.ConfigurationError:
    return exceptions.ConfigurationError(
        f"no failure group {id!r} in error queue {queue!r} (see: sqlqueue errors groups)"
    )
