"""The grouping keys of a failed message, and writing them to ``sqlqueue_failure_groups``.

What both writers of :mod:`sqlqueue_orm.models.failure_group` share: an endpoint moving a
message to its error queue writes the entry in the move's transaction (:func:`insert_one`), and
a listing of the groups writes those of rows moved by others (.NET endpoints, other tools).
:mod:`sqlqueue_orm.recoverability.groups` says how the keys are made.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import db, headers
from sqlqueue_orm.models import failure_group

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

#: What a missing key is shown as.
NONE_LABEL = "(none)"
UNREADABLE_LABEL = "(headers cannot be read)"

TABLE = failure_group.failure_group_table()
_TRACEBACK = "Traceback (most recent call last)"
# A Python frame: File "/srv/app/handlers.py", line 12, in handle
_PYTHON_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<function>.+?)\s*$')
# A .NET frame: at Sales.Handler.Handle(PlaceOrder message) in C:\src\Handler.cs:line 42. The
# method ends where " in <file>" or the line's trailing blanks begin: a lookahead, so a long
# line is not backtracked over.
_DOTNET_FRAME = re.compile(r"^\s*at (?P<method>.+?)(?= in .|\s*$)")
_WIRE_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d):(\d{6}) Z", re.ASCII)
_FOLDER = re.compile(r"[\\/]")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_GENERATED = re.compile(r"__\d+(?:_\d+)*")
# The numbers of compiler-generated classes: <>c__DisplayClass12_0, <>f__AnonymousType0.
_GENERATED_CLASS = re.compile(r"(?<=__DisplayClass)\d+(?:_\d+)*|(?<=__AnonymousType)\d+")
_ANGLE_NUMBER = re.compile(r"(?<=[<>])\d+|\d+(?=>)")


@functools.lru_cache(maxsize=4096)
def group_id(by: str, key: str) -> str:
    """The id of the group of grouping *by* whose key is *key* (16 hex digits)."""
    digest = hashlib.sha256(f"{by}\0{key}".encode()).hexdigest()
    return digest[: failure_group.GROUP_LENGTH]


def _python(file: str, function: str) -> str:
    name = _FOLDER.split(file)[-1]
    return f"{name}:{_ADDRESS.sub('', function) if '0x' in function else function}"


def _dotnet(method: str) -> str:
    if "0x" in method:
        method = _ADDRESS.sub("", method)
    if "__" in method:
        method = _GENERATED_CLASS.sub("", _GENERATED.sub("__", method))
    return _ANGLE_NUMBER.sub("", method) if "<" in method or ">" in method else method


def frames(stack_trace: str) -> list[str]:
    """The frames of the last exception of *stack_trace*, as stable identifiers.

    Only lines that start (after blanks) as a frame does are matched against the patterns:
    the source lines and the exception's text, most of a trace, are skipped at C speed.
    """
    lines = stack_trace.splitlines()
    start = 0
    if _TRACEBACK in stack_trace:  # a chained Python traceback: the last one raised
        for index, line in enumerate(lines):
            if line.startswith(_TRACEBACK):
                start = index
    found = []
    for index in range(start, len(lines)):
        line = lines[index]
        head = line.lstrip()[:6]
        if head.startswith('File "'):
            python = _PYTHON_FRAME.match(line)
            if python is not None:
                found.append(_python(python["file"], python["function"]))
        elif head.startswith("at "):
            dotnet = _DOTNET_FRAME.match(line)
            if dotnet is not None:
                found.append(_dotnet(dotnet["method"]))
    return found


def stack_fingerprint(exception_type: str | None, stack_trace: str | None) -> tuple[str, str]:
    """The key of the ``type`` grouping and its label, from the exception's type and trace.

    The key is the type and the trace's frames; the label is the type and the innermost frame
    (where it was raised: Python's last frame, .NET's first).
    """
    kind = exception_type or NONE_LABEL
    found = frames(stack_trace or "")
    python = bool(stack_trace) and _TRACEBACK in (stack_trace or "")
    innermost = (found[-1] if python else found[0]) if found else ""
    label = f"{kind}: at {innermost}" if innermost else kind
    return "\n".join([kind, *found]), label


def message_type(enclosed: str | None) -> str | None:
    """The first type of ``NServiceBus.EnclosedMessageTypes`` without its assembly part."""
    if not enclosed:
        return None
    first = enclosed.split(";", 1)[0]
    return first.split(",", 1)[0].strip() or None


def _cut(text: str | None) -> str | None:
    return None if text is None else text[: failure_group.TEXT_LENGTH]


def time_of_failure(text: str | None) -> dt.datetime | None:
    """``NServiceBus.TimeOfFailure`` as a naive UTC time (None when missing or unreadable)."""
    if not text:
        return None
    wire = _WIRE_TIME.fullmatch(text.strip())
    if wire is not None:  # the form NServiceBus writes, read without strptime (a fifth of a fill)
        try:
            year, month, day, hour, minute, second, micro = map(int, wire.groups())
            return dt.datetime(year, month, day, hour, minute, second, micro)
        except ValueError:  # out of range: as the parser below says
            return None
    try:
        moment = headers.parse_time(text)
    except ValueError:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    return moment


def entry(
    queue: str, id: uuid.UUID, message_id: str | None, found: Mapping[str, str | None] | None
) -> dict[str, Any]:
    """The side-table row of message *id* of error queue *queue* (its address as text).

    :param found: the message's headers; None when they cannot be read.
    """
    if found is None:
        key = label = UNREADABLE_LABEL
        endpoint = kind = exception_type = None
        failed_at = None
    else:
        exception_type = found.get(headers.EXCEPTION_TYPE)
        key, label = stack_fingerprint(exception_type, found.get(headers.EXCEPTION_STACK_TRACE))
        endpoint = found.get(headers.PROCESSING_ENDPOINT) or None
        kind = message_type(found.get(headers.ENCLOSED_MESSAGE_TYPES))
        failed_at = time_of_failure(found.get(headers.TIME_OF_FAILURE))
    return {
        "queue": queue,
        "id": id,
        "message_id": _cut(message_id),
        "exception_type": _cut(exception_type),
        "stack_group": group_id("type", key),
        "stack_label": _cut(label),
        "endpoint": _cut(endpoint),
        "endpoint_group": group_id("endpoint", endpoint or ""),
        "message_type": _cut(kind),
        "message_type_group": group_id("message-type", kind or ""),
        "failed_at": failed_at,
    }


_created: set[tuple[int, str]] = set()
_created_lock = threading.Lock()


def _engine_key(engine: Engine) -> tuple[int, str]:
    return (id(engine), str(engine.url))


def ensure_table(engine: Engine) -> None:
    """Create ``sqlqueue_failure_groups`` when missing (once per engine and process)."""
    key = _engine_key(engine)
    if key in _created:
        return
    with _created_lock:
        if key in _created:
            return
        with db.wrap_db_errors(failure_group.TABLE_NAME), engine.begin() as connection:
            TABLE.create(connection, checkfirst=True)
        _created.add(key)


def find_table(engine: Engine) -> bool:
    """Whether ``sqlqueue_failure_groups`` exists (remembered once it does)."""
    key = _engine_key(engine)
    if key in _created:
        return True
    with db.wrap_db_errors(failure_group.TABLE_NAME), engine.connect() as connection:
        exists = sa.inspect(connection).has_table(failure_group.TABLE_NAME)
    if exists:
        _created.add(key)
    return exists


def table_known(engine: Engine) -> bool:
    """Whether this process has created or found the table on *engine* (no query)."""
    return _engine_key(engine) in _created


def insert_one(connection: Connection, values: dict[str, Any]) -> bool:
    """Insert one entry in *connection*'s transaction, in a savepoint of its own.

    Returns whether it was written. Any database error (the table dropped since, an entry of
    that id already there) rolls back only the savepoint, so the transaction goes on without
    the entry; a listing of the groups then writes it.
    """
    savepoint = connection.begin_nested()
    try:
        connection.execute(sa.insert(TABLE), [values])
    except sa.exc.DBAPIError:
        savepoint.rollback()
        return False
    savepoint.commit()
    return True
