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
  (``0x7f...``) or the numbers .NET gives compiler-generated methods (``<Handle>b__0_1``). Two
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

Keys are computed once per message, in Python, and kept in ``sqlqueue_failure_groups``
(:mod:`sqlqueue_orm.models.failure_group`): each listing first adds the entries of the messages
that have none (the queue's ids and the entries' compared as sets, so rows whose identity
committed late are not missed, as they would be after a "highest ``RowVersion`` seen") and
deletes those whose message is gone; counting is then a ``GROUP BY`` in SQL joined with the
error queue, so a listing reads two columns of ids and one join rather than every header of the
queue in Python. :meth:`FailureGroups.retry` and :meth:`FailureGroups.delete` take
the group's messages as they are at that moment and hand them to :meth:`ErrorQueue.retry` /
:meth:`ErrorQueue.delete`: one transaction per message, so two operators retrying one group send
each message once.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import hashlib
import logging
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import db, exceptions, headers
from sqlqueue_orm.models import failure_group

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue

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
#: What a missing key is shown as.
NONE_LABEL = "(none)"
UNREADABLE_LABEL = "(headers cannot be read)"

TABLE = failure_group.failure_group_table()
_TEXT = sa.String(36)
_ID_PATTERN = re.compile(f"[0-9a-f]{{{failure_group.GROUP_LENGTH}}}")
# A Python frame: File "/srv/app/handlers.py", line 12, in handle
_PYTHON_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<function>.+?)\s*$')
# A .NET frame: at Sales.Handler.Handle(PlaceOrder message) in C:\src\Handler.cs:line 42
_DOTNET_FRAME = re.compile(r"^\s*at (?P<method>.+?)(?: in .+?(?::line \d+)?)?\s*$")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_GENERATED = re.compile(r"__\d+(?:_\d+)*")
_ANGLE_NUMBER = re.compile(r"(?<=[<>])\d+|\d+(?=>)")


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


def group_id(by: str, key: str) -> str:
    """The id of the group of grouping *by* whose key is *key* (16 hex digits)."""
    digest = hashlib.sha256(f"{by}\0{key}".encode()).hexdigest()
    return digest[: failure_group.GROUP_LENGTH]


def _frames(stack_trace: str) -> list[str]:
    """The frames of the last exception of *stack_trace*, as stable identifiers."""
    lines = stack_trace.splitlines()
    start = 0
    for index, line in enumerate(lines):  # a chained Python traceback: the last one raised
        if line.startswith("Traceback (most recent call last)"):
            start = index
    frames = []
    for line in lines[start:]:
        python = _PYTHON_FRAME.match(line)
        if python is not None:
            file = re.split(r"[\\/]", python["file"])[-1]
            frames.append(f"{file}:{_ADDRESS.sub('', python['function'])}")
            continue
        dotnet = _DOTNET_FRAME.match(line)
        if dotnet is not None:
            method = _GENERATED.sub("__", _ADDRESS.sub("", dotnet["method"]))
            frames.append(_ANGLE_NUMBER.sub("", method))
    return frames


def stack_fingerprint(exception_type: str | None, stack_trace: str | None) -> tuple[str, str]:
    """The key of the ``type`` grouping and its label, from the exception's type and trace.

    The key is the type and the trace's frames (see the module's docstring for what is
    removed); the label is the type and the innermost frame (where it was raised: Python's
    last frame, .NET's first).
    """
    kind = exception_type or NONE_LABEL
    frames = _frames(stack_trace or "")
    python = bool(stack_trace) and "Traceback (most recent call last)" in (stack_trace or "")
    innermost = (frames[-1] if python else frames[0]) if frames else ""
    label = f"{kind}: at {innermost}" if innermost else kind
    return "\n".join([kind, *frames]), label


def message_type(enclosed: str | None) -> str | None:
    """The first type of ``NServiceBus.EnclosedMessageTypes`` without its assembly part."""
    if not enclosed:
        return None
    first = enclosed.split(";", 1)[0]
    return first.split(",", 1)[0].strip() or None


def _cut(text: str | None) -> str | None:
    return None if text is None else text[: failure_group.TEXT_LENGTH]


def entry(queue: str, message: IncomingMessage) -> dict[str, Any]:
    """The side-table row of *message* of error queue *queue* (its address as text)."""
    if message.headers_error is not None:
        key = label = UNREADABLE_LABEL
        endpoint = kind = exception_type = None
        failed_at = None
    else:
        found = message.headers
        exception_type = found.get(headers.EXCEPTION_TYPE)
        key, label = stack_fingerprint(exception_type, found.get(headers.EXCEPTION_STACK_TRACE))
        endpoint = found.get(headers.PROCESSING_ENDPOINT) or None
        kind = message_type(found.get(headers.ENCLOSED_MESSAGE_TYPES))
        failed_at = _time_of_failure(found.get(headers.TIME_OF_FAILURE))
    return {
        "queue": queue,
        "id": message.id,
        "message_id": _cut(message.message_id),
        "exception_type": _cut(exception_type),
        "stack_group": group_id("type", key),
        "stack_label": _cut(label),
        "endpoint": _cut(endpoint),
        "endpoint_group": group_id("endpoint", endpoint or ""),
        "message_type": _cut(kind),
        "message_type_group": group_id("message-type", kind or ""),
        "failed_at": failed_at,
    }


def _time_of_failure(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        moment = headers.parse_time(text)
    except ValueError:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    return moment


def _aware(moment: Any) -> dt.datetime | None:
    if moment is None:
        return None
    if isinstance(moment, str):  # SQLite's MIN/MAX of a DATETIME column give its text
        moment = dt.datetime.fromisoformat(moment)
    assert isinstance(moment, dt.datetime)
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment


_created: set[tuple[int, str]] = set()
_created_lock = threading.Lock()


def ensure_table(engine: Engine) -> None:
    """Create ``sqlqueue_failure_groups`` when missing (once per engine and process)."""
    key = (id(engine), str(engine.url))
    if key in _created:
        return
    with _created_lock:
        if key in _created:
            return
        with db.wrap_db_errors(failure_group.TABLE_NAME), engine.begin() as connection:
            TABLE.create(connection, checkfirst=True)
        _created.add(key)


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

        The two sets of ids (the queue's and the entries') are read and compared in Python:
        an anti-join in SQL would probe the queue's ``Id``, which has no index in NServiceBus's
        SQL Server layout nor on SQLite, and PostgreSQL's planner, misled by the statistics of
        a table that has just been filled, picks a nested loop over it; reading two columns of
        ids costs the same every time.
        """
        engine = self.errors.transport.engine
        ensure_table(engine)
        queue_table = self.errors.table()
        mine = TABLE.c.queue == self.queue
        with db.wrap_db_errors(self.queue):
            with engine.connect() as connection:
                # As text (32 hex digits, whatever form the database casts to): strings hash
                # and compare in C, uuid.UUID objects in Python.
                present = _hex(connection.execute(sa.select(sa.cast(queue_table.c.Id, _TEXT))))
                known = _hex(connection.execute(sa.select(sa.cast(TABLE.c.id, _TEXT)).where(mine)))
            missing = {_uuid(each) for each in present - known}
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

    def _fill(self, missing: set[uuid.UUID]) -> int:
        """Write the entries of the messages *missing* has (those gone meanwhile are skipped)."""
        engine = self.errors.transport.engine
        queue_table = self.errors.table()
        added = 0
        if len(missing) <= _FILL_BATCH:  # the usual case: a few new messages, found by id
            statement = self.errors.select_messages(body=False).where(
                queue_table.c.Id.in_(sorted(missing))
            )
            with engine.begin() as connection:
                rows = connection.execute(statement).all()
                entries = [entry(self.queue, self.errors.message_of(row)) for row in rows]
                return self._insert(connection, entries) if entries else 0
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
                    if _uuid(row[0]) in missing
                ]
                if entries:
                    added += self._insert(connection, entries)
            if len(rows) < _FILL_BATCH:
                return added
            after = int(rows[-1][1])

    def _insert(self, connection: Connection, entries: list[dict[str, Any]]) -> int:
        """Insert *entries*; one another process inserted first is skipped."""
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
        chosen = self.ids(id)
        sent = self.errors.retry(chosen)
        log.info(
            "queue %s: failure group %s: %d of %d message(s) sent back",
            self.errors.name,
            id,
            sent,
            len(chosen),
        )
        self.refresh()  # the entries of the messages sent back go
        return sent

    def delete(self, id: str) -> int:
        """:meth:`ErrorQueue.delete` every message of group *id*; return how many were deleted."""
        chosen = self.ids(id)
        deleted = self.errors.delete(chosen)
        log.info(
            "queue %s: failure group %s: %d of %d message(s) deleted",
            self.errors.name,
            id,
            deleted,
            len(chosen),
        )
        self.refresh()
        return deleted


def _hex(result: sa.Result[Any]) -> set[str]:
    """The ids of a one-column result of text ids, as 32 lower-case hex digits."""
    return {str(value).replace("-", "").lower() for value in result.scalars()}


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
