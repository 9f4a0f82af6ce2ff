r"""Finding failed messages: filters, keyset paging through every row, and "all that match".

::

    search = ErrorSearch(ErrorQueue(transport))
    wanted = ErrorFilter(header=("Custom", "42"), text="order 7")
    page = search.page(wanted, limit=50)           # the oldest 50 that match
    more = search.page(wanted, after=page.next)    # the next 50 (page.next None: no more)
    ids = search.matching_ids(wanted, most=1000)   # every match, for a retry or delete

Pages follow the table's order (``RowVersion``, oldest first) and the cursor is the last row's
``RowVersion``: a page starts after it, so rows retried or deleted meanwhile never shift a page
and nothing is shown twice; a row that arrives with a higher ``RowVersion`` shows on a later page
(one whose identity committed after a later page was read shows on none: start again).

Each filter narrows in SQL first, then is checked exactly on the rows found: the message id
(``NServiceBus.MessageId``, or the row's ``Id``), a header (``name=value``, the whole value, case
sensitive) and the endpoint are first looked for as text in the Headers column (the longest run
of characters every JSON writer writes unescaped, so escapes such as ``\u00e9`` are no hurdle),
the body text as bytes in the Body column (UTF-8; :attr:`DialectSupport.body_contains`), a
group through ``sqlqueue_failure_groups`` (:mod:`~sqlqueue_orm.recoverability.groups`). The
exception type and the time of failure are checked in Python, as :meth:`ErrorQueue.list` checks
them.
:meth:`ErrorSearch.matching_ids` returns the ids of every match at that moment, bounded: a retry
of them (:meth:`ErrorQueue.retry`) sends each of those messages back once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sqlqueue_orm import db, dialects, exceptions
from sqlqueue_orm.recoverability import groups
from sqlqueue_orm.recoverability.error_queue import FailedMessage, aware, type_matches

if TYPE_CHECKING:
    from sqlqueue_orm.recoverability.error_queue import ErrorQueue

#: Rows read per statement while looking for matches.
_BATCH = 500
# Characters JSON writes one way only (no escape), in any writer.
_PLAIN = re.compile(r"[A-Za-z0-9 ._:@#$%^*()+=,;!?\[\]{}|~`-]+")


@dataclasses.dataclass(frozen=True)
class ErrorFilter:
    """What failed messages to find; every filter given must match (None: any)."""

    #: ``NServiceBus.MessageId``, or the row's native ``Id``.
    message_id: str | None = None
    #: A header's name and whole value.
    header: tuple[str, str] | None = None
    #: Text the body holds (as UTF-8 bytes).
    text: str | None = None
    #: A failure group's id (:class:`~sqlqueue_orm.recoverability.groups.FailureGroups`).
    group: str | None = None
    #: The exception's full type name, or its last part.
    exception_type: str | None = None
    #: ``NServiceBus.ProcessingEndpoint``.
    endpoint: str | None = None
    #: Failed at or after / before (a naive datetime is UTC).
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    @property
    def active(self) -> bool:
        """Whether any filter is given."""
        return any(getattr(self, field.name) for field in dataclasses.fields(self))

    def matches(self, failed: FailedMessage) -> bool:
        """Whether *failed* passes every filter checked in Python (all but the group)."""
        if self.message_id is not None and not (
            failed.message_id == self.message_id or failed.id == _guid_text(self.message_id)
        ):
            return False
        if self.header is not None:
            name, value = self.header
            if failed.headers.get(name) != value:
                return False
        if self.text is not None and self.text.encode() not in failed.body:
            return False
        if self.exception_type is not None and not type_matches(
            self.exception_type, failed.exception_type
        ):
            return False
        if self.endpoint is not None and failed.processing_endpoint != self.endpoint:
            return False
        if self.since is not None or self.until is not None:
            when = failed.time_of_failure
            start, end = aware(self.since), aware(self.until)
            if when is None or (start is not None and when < start):
                return False
            if end is not None and when >= end:
                return False
        return True


def parse_header(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as a header filter (the value may be empty or hold ``=``).

    :raises ConfigurationError: naming *text* when it has no ``=`` or no name.
    """
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise exceptions.ConfigurationError(
            f"header filter {text!r} must be NAME=VALUE (e.g. NServiceBus.ConversationId=42)"
        )
    return name, value


def parse_cursor(text: str | None) -> int | None:
    """A page cursor (a ``RowVersion``) from its text; None or ``""``: the first page.

    :raises ConfigurationError: naming *text* when it is not a whole number >= 0.
    """
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise exceptions.ConfigurationError(
            f"cursor {text!r} must be the number a page printed as its next cursor"
        )
    return value


def _guid_text(text: str) -> str | None:
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        return None


def _plain_run(text: str) -> str | None:
    """The longest part of *text* every JSON writer writes as it is, or None."""
    runs = _PLAIN.findall(text)
    return max(runs, key=len) if runs else None


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of matches, oldest first."""

    messages: list[FailedMessage]
    #: The cursor of the next page (pass it as ``after``); None: this is the last page.
    next: str | None


class ErrorSearch:
    """Filtered, paged reading of one error queue.

    :param errors: the :class:`~sqlqueue_orm.recoverability.error_queue.ErrorQueue`.
    """

    def __init__(self, errors: ErrorQueue) -> None:
        self.errors = errors

    def _statement(self, wanted: ErrorFilter, after: int | None, batch: int) -> sa.Select[Any]:
        table = self.errors.table()
        statement = self.errors.select_messages()
        conditions: list[sa.ColumnElement[bool] | sa.TextClause] = []
        if after is not None:
            conditions.append(table.c.RowVersion > after)
        in_headers = []
        if wanted.message_id is not None:
            guid = _guid_text(wanted.message_id)
            run = _plain_run(wanted.message_id)
            if guid is not None and run is not None:  # the row's Id, or a GUID MessageId
                conditions.append(
                    sa.or_(
                        table.c.Id == uuid.UUID(guid),
                        table.c.Headers.contains(run, autoescape=True),
                    )
                )
            elif guid is None:
                in_headers.append(wanted.message_id)
        if wanted.header is not None:
            in_headers.extend(wanted.header)
        if wanted.endpoint is not None:
            in_headers.append(wanted.endpoint)
        for text in in_headers:
            run = _plain_run(text)
            if run is not None:
                # LIKE on the stored text; the Headers column compares as text on every dialect
                conditions.append(table.c.Headers.contains(run, autoescape=True))
        if wanted.text:
            engine = self.errors.transport.engine
            template = dialects.for_dialect(engine).body_contains
            if template:
                quoted = engine.dialect.identifier_preparer.quote(table.c.Body.name)
                conditions.append(
                    sa.text(template.format(body=quoted)).bindparams(
                        sa.bindparam("needle", wanted.text.encode(), type_=sa.LargeBinary())
                    )
                )
        if wanted.group is not None:
            entries = groups.TABLE
            group = wanted.group.strip().lower()
            conditions.append(
                table.c.Id.in_(
                    sa.select(entries.c.id).where(
                        entries.c.queue == str(self.errors.address),
                        sa.or_(*(entries.c[name] == group for name in groups.GROUPINGS.values())),
                    )
                )
            )
        return statement.where(*conditions).order_by(table.c.RowVersion).limit(batch)

    def page(self, wanted: ErrorFilter, *, after: str | None = None, limit: int = 100) -> Page:
        """Up to *limit* matches after cursor *after* (None: from the first row), oldest first.

        :raises ConfigurationError: *after* is not a cursor, or *limit* is not >= 1.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise exceptions.ConfigurationError(f"limit {limit!r} must be a whole number >= 1")
        cursor = parse_cursor(after)
        if wanted.group is not None:
            groups.FailureGroups(self.errors).refresh()
        found: list[tuple[int, FailedMessage]] = []
        batch = max(_BATCH, limit + 1)
        engine = self.errors.transport.engine
        with db.wrap_db_errors(str(self.errors.address)), engine.connect() as connection:
            while len(found) <= limit:
                rows = connection.execute(self._statement(wanted, cursor, batch)).all()
                for row in rows:
                    cursor = int(row[1])
                    failed = FailedMessage.from_message(self.errors.message_of(row))
                    if wanted.matches(failed):
                        found.append((cursor, failed))
                        if len(found) > limit:
                            break
                if len(rows) < batch:
                    break
        if len(found) > limit:
            return Page([each for _, each in found[:limit]], str(found[limit - 1][0]))
        return Page([each for _, each in found], None)

    def named(self, text: str) -> list[FailedMessage]:
        """The messages *text* names, oldest first: by message id, else by row id.

        Those whose ``NServiceBus.MessageId`` is *text*; when none is, the one whose row id it
        is (a GUID, in any case, with or without braces). An operator types the message id the
        endpoint's log and the dashboard show; the row id (``id`` in JSON) names one message
        when several share a message id.
        """
        found: list[FailedMessage] = []
        after: str | None = None
        while True:
            page = self.page(ErrorFilter(message_id=text), after=after, limit=_BATCH)
            found.extend(page.messages)
            if page.next is None:
                break
            after = page.next
        by_message = [each for each in found if each.message_id == text]
        if by_message:
            return by_message
        row_id = _guid_text(text)
        return [each for each in found if each.id == row_id]

    def matching_ids(self, wanted: ErrorFilter, *, most: int) -> tuple[str, ...]:
        """The row ids of every message that matches *wanted* now, oldest first.

        :raises ConfigurationError: more than *most* match (nothing is to be changed then).
        """
        ids: list[str] = []
        after: str | None = None
        while True:
            page = self.page(wanted, after=after, limit=_BATCH)
            ids.extend(each.id for each in page.messages)
            if len(ids) > most:
                raise exceptions.ConfigurationError(
                    f"more than {most} messages match in error queue {self.errors.name!r}: "
                    "narrow the filter, or retry or delete them by group"
                )
            if page.next is None:
                return tuple(ids)
            after = page.next
