r"""Failure groups and search on a large error queue.

Scenario ``groups`` of ``python -m benchmarks`` (``--only groups``; ``--failed-messages N`` sets the
error queue's size, default 100,000 in 20 groups, ``--quick`` 10,000). The queue is filled
untimed with failed messages as an endpoint writes them (a traceback, the exception's message
holding the message's number, a time of failure each), then timed through the very calls the
CLI and the dashboard make:

* ``groups, first listing``: the first :meth:`FailureGroups.list` fingerprints every message
  once (parses its headers in Python, writes ``sqlqueue_failure_groups``): a one-time cost,
  paid only for rows others write (our endpoints write the entry as they move the message);
  ``groups, first listing, .NET rows`` the same over as many rows as a .NET endpoint writes
  them (compact JSON, ``\/`` escapes, a .NET stack trace);
* ``groups by type`` and ``groups by endpoint``: a listing once every message has its entry
  (one statement counting rows, entries and their pairs, then the ``GROUP BY``);
* ``filtered page``: one page of 100 of the errors page by a header (``Tenant=t7``, a
  twentieth of the rows), by body text, by a message id, and a page of one group;
* beside them, the ways not taken: ``groups by type, ids read each time`` (both columns of ids
  read and compared on every listing, as before the rows and entries were counted first),
  ``groups in Python`` (every header read and fingerprinted on
  each listing, no side table) and, on PostgreSQL, ``groups in SQL, no fingerprint`` (``GROUP BY``
  on ``headers::jsonb`` of the type and an md5 of the raw stack trace, which cannot drop what
  varies, so it splits every group by message text).

Each timed call runs :data:`ROUNDS` times, the variants alternating round by round; the median
is reported (p50) beside the target (under one second), as "rate" the rows the call covered
per second. Timings on a shared machine vary: compare within one run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa

from benchmarks.workload import Result
from sqlqueue_orm import OutgoingMessage, headers
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.recoverability import groups as failure_groups
from sqlqueue_orm.recoverability.error_queue import ErrorQueue, FailedMessage
from sqlqueue_orm.recoverability.groups import FailureGroup, FailureGroups
from sqlqueue_orm.recoverability.search import ErrorFilter, ErrorSearch

if TYPE_CHECKING:
    from benchmarks.harness import Run

#: Timed rounds of each call (the median is reported).
ROUNDS = 5
GROUPS = 20
PAGE = 100
TARGET = "target < 1 s"
SCENARIO = "error queue, {n:,} failed in {g} groups"
_CHUNK = 5_000


def _trace(kind: str, function: str, number: int) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/sqlqueue_orm/receiving/pump.py", line 311, in _handle\n'
        "    handler(message)\n"
        f'  File "/srv/app/orders/handlers.py", line {40 + number % 7}, in {function}\n'
        f"    raise {kind}(f'order {{number}} rejected')\n"
        f"{kind}: order {number} rejected <Order at 0x{number:x}>\n"
    )


def _message(number: int) -> OutgoingMessage:
    group = number % GROUPS
    kind = ("ValueError", "KeyError", "TimeoutError", "PermissionError")[group % 4]
    function = f"handle_{group // 4}"
    return OutgoingMessage(
        f'{{"order": {number}, "customer": "customer-{number % 997}"}}'.encode(),
        headers={
            headers.FAILED_QUEUE: f"endpoint_{group % 5}",
            headers.TIME_OF_FAILURE: headers.format_time(
                dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=number)
            ),
            headers.EXCEPTION_TYPE: f"builtins.{kind}",
            headers.EXCEPTION_MESSAGE: f"order {number} rejected",
            headers.EXCEPTION_HELP_LINK: None,
            headers.EXCEPTION_STACK_TRACE: _trace(kind, function, number),
            headers.PROCESSING_ENDPOINT: f"endpoint_{group % 5}",
            headers.ENCLOSED_MESSAGE_TYPES: f"Orders.Message{group % 3}, Orders",
            "Tenant": f"t{number % 20}",
        },
    )


def _fill(run: Run, queue: str, count: int) -> None:
    for start in range(0, count, _CHUNK):
        size = min(_CHUNK, count - start)
        run.transport.send_many(queue, [_message(start + i) for i in range(size)])


def _dotnet_row(number: int) -> PreparedMessage:
    """Failed message *number* as a .NET endpoint writes it."""
    group = number % GROUPS
    trace = (
        f"System.InvalidOperationException{group % 4}: Order {number} rejected\r\n"
        f"   at Orders.Handler{group // 4}.<Handle>d__{number % 9}.MoveNext() in "
        f"C:\\build\\{number % 13}\\Handler.cs:line {40 + number % 7}\r\n"
        "   at NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext context) in "
        "/_/src/NServiceBus.Core/Pipeline/InvokeHandlerTerminator.cs:line 25\r\n"
        "   at NServiceBus.LoadHandlersConnector.Invoke(IIncomingLogicalMessageContext context)"
    )
    found = {
        headers.MESSAGE_ID: str(uuid.UUID(int=number + 1)),
        headers.FAILED_QUEUE: f"Endpoint{group % 5}@[dbo]@[nsb]",
        headers.TIME_OF_FAILURE: headers.format_time(
            dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=number)
        ),
        headers.EXCEPTION_TYPE: f"System.InvalidOperationException{group % 4}",
        headers.EXCEPTION_MESSAGE: f"Order {number} rejected",
        headers.EXCEPTION_HELP_LINK: None,
        headers.EXCEPTION_SOURCE: "Orders",
        headers.EXCEPTION_STACK_TRACE: trace,
        headers.PROCESSING_ENDPOINT: f"Endpoint{group % 5}",
        headers.ENCLOSED_MESSAGE_TYPES: f"Orders.Message{group % 3}, Orders, Version=1.0.0.0",
    }
    text = json.dumps(found, separators=(",", ":")).replace("/", "\\/")
    return PreparedMessage(uuid.uuid4(), str(found[headers.MESSAGE_ID]), text, b"{}", None)


def _fill_dotnet(run: Run, queue: str, count: int) -> None:
    table_queue = run.transport.queues.table_queue(queue)
    for start in range(0, count, _CHUNK):
        size = min(_CHUNK, count - start)
        with run.transport.engine.begin() as connection:
            table_queue.send(connection, [_dotnet_row(start + i) for i in range(size)])


def _first_listing(
    run: Run, scenario: str, side: str, errors: ErrorQueue, count: int
) -> list[FailureGroup]:
    """Time the first listing of *errors* (every message fingerprinted) and check its sums."""
    started = time.perf_counter()
    first = FailureGroups(errors).list()
    seconds = time.perf_counter() - started
    if len(first) != GROUPS or sum(g.count for g in first) != count:
        raise AssertionError(f"groups: {len(first)} groups of {sum(g.count for g in first)}")
    run.add(
        Result(
            run.database.name,
            scenario,
            side,
            count,
            seconds,
            count / seconds,
            seconds * 1000,
            seconds * 1000,
            note="one-time: fingerprints every message",
        )
    )
    return first


def _python_groups(errors: ErrorQueue) -> dict[str, int]:
    """The way not taken: every header parsed and fingerprinted on each listing."""
    found: Counter[str] = Counter()
    after = None
    while True:
        page = errors.transport.browse(errors.name, 5_000, after=after)
        for row in page:
            failed = FailedMessage.from_message(row)
            key, _label = failure_groups.stack_fingerprint(
                failed.exception_type, failed.headers.get(headers.EXCEPTION_STACK_TRACE)
            )
            found[key] += 1
        if len(page) < 5_000:
            return dict(found)
        after = page[-1].row_version


def _groups_ids_read(errors: ErrorQueue) -> int:
    """The way taken before: every listing reads and compares both columns of ids."""
    groups = FailureGroups(errors)
    queue_table = errors.table()
    entries = failure_groups.TABLE
    text = sa.String(36)
    with errors.transport.engine.connect() as connection:
        present = set(connection.scalars(sa.select(sa.cast(queue_table.c.Id, text))))
        known = set(
            connection.scalars(
                sa.select(sa.cast(entries.c.id, text)).where(entries.c.queue == groups.queue)
            )
        )
    if len(present ^ known):
        raise AssertionError("groups: the entries differ from the queue")
    return len(groups._counted("type", "stack_group"))


def _sql_groups(errors: ErrorQueue) -> int:
    """The way not taken on PostgreSQL: GROUP BY in SQL on the JSON text, no fingerprint."""
    table = errors.transport.queues.table_queue(errors.name).quoted_table.replace("%%", "%")
    statement = (
        "SELECT headers::jsonb ->> 'NServiceBus.ExceptionInfo.ExceptionType', "
        "md5(headers::jsonb ->> 'NServiceBus.ExceptionInfo.StackTrace'), count(*), "
        "min(headers::jsonb ->> 'NServiceBus.TimeOfFailure'), "
        f"max(headers::jsonb ->> 'NServiceBus.TimeOfFailure') FROM {table} GROUP BY 1, 2"
    )
    with errors.transport.engine.connect() as connection:
        return len(connection.exec_driver_sql(statement).all())


def groups_scenario(run: Run) -> None:
    """Fill an error queue with ``failed_messages`` rows; time groups and filtered pages."""
    count = run.settings.failed_messages
    queue = run.new_queue("errors")
    run.log(f"  {run.database.name:10} groups: filling {count:,} failed messages (untimed)")
    _fill(run, queue, count)
    errors = ErrorQueue(run.transport, queue)
    scenario = SCENARIO.format(n=count, g=GROUPS)

    first = _first_listing(run, scenario, "groups, first listing (fills)", errors, count)

    target_group = first[0]
    sample = ErrorSearch(errors).page(ErrorFilter(), after=str(count // 2), limit=1).messages
    middle_id = sample[0].message_id if sample else ""
    calls: list[tuple[str, int, Callable[[], object]]] = [
        ("groups by type", count, lambda: FailureGroups(errors).list("type")),
        ("groups by endpoint", count, lambda: FailureGroups(errors).list("endpoint")),
        (
            "filtered page: header",
            PAGE,
            lambda: _page(errors, ErrorFilter(header=("Tenant", "t7"))),
        ),
        ("filtered page: body text", PAGE, lambda: _page(errors, ErrorFilter(text='customer-99"'))),
        ("filtered page: message id", 1, lambda: _page(errors, ErrorFilter(message_id=middle_id))),
        ("filtered page: group", PAGE, lambda: _page(errors, ErrorFilter(group=target_group.id))),
        ("groups in Python, no side table", count, lambda: _python_groups(errors)),
        ("groups by type, ids read each time", count, lambda: _groups_ids_read(errors)),
    ]
    if run.transport.engine.dialect.name == "postgresql":
        calls.append(("groups in SQL, no fingerprint", count, lambda: _sql_groups(errors)))
    latencies: dict[str, list[float]] = {name: [] for name, _, _ in calls}
    for _round in range(ROUNDS):
        for name, _rows, call in calls:
            began = time.perf_counter()
            call()
            latencies[name].append(time.perf_counter() - began)
    for name, rows, _call in calls:
        median = statistics.median(latencies[name])
        result = Result(
            run.database.name,
            scenario,
            name,
            rows,
            median,
            rows / median,
            median * 1000,
            max(latencies[name]) * 1000,
            note=f"median of {ROUNDS} rounds",
        )
        if not name.startswith("groups in"):
            result = _aimed(result, median)
        run.add(result)
    run.transport.purge_all(queue)
    FailureGroups(errors).refresh()  # the entries of the purged messages go
    # After the timed calls, so that the side table they count holds no dead rows of this queue.
    dotnet = run.new_queue("errors_dotnet")
    run.log(f"  {run.database.name:10} groups: filling {count:,} .NET failed messages (untimed)")
    _fill_dotnet(run, dotnet, count)
    dotnet_errors = ErrorQueue(run.transport, dotnet)
    _first_listing(run, scenario, "groups, first listing, .NET rows", dotnet_errors, count)
    run.transport.purge_all(dotnet)
    FailureGroups(dotnet_errors).refresh()


def _page(errors: ErrorQueue, wanted: ErrorFilter) -> int:
    found = ErrorSearch(errors).page(wanted, limit=PAGE).messages
    if not found:
        raise AssertionError(f"groups: nothing found for {wanted}")
    return len(found)


def _aimed(result: Result, median: float) -> Result:
    return dataclasses.replace(
        result, target=TARGET, measured=f"{median * 1000:,.0f} ms", met=median < 1.0
    )
