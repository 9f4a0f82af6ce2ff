"""Slots: what the global and the per-key limits claim, and the statements that claim them.

A slot is one of K locks named after the queue (the global limit) or the queue and a key (the
per-key limit), held by the receive's transaction until it commits or rolls back, so it covers
the receive, the handlers and the commit; a crash frees it with the connection. The locks and
the statements taking them are the dialect's (:class:`~sqlqueue_orm.dialects.flow.FlowStatements`:
PostgreSQL's advisory locks, SQL Server's ``sp_getapplock``). The claims run on the driver's
cursor, as the receive does (:mod:`sqlqueue_orm.connections`).

Each worker tries its own slot first (its number in the process plus a random offset per
process, modulo K), then the next ones: while the limit is far from binding the first lock
tried is free.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from sqlqueue_orm import connections, dialects, exceptions
from sqlqueue_orm.queuing import sql

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Dialect

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.queuing.table_queue import TableQueue
    from sqlqueue_orm.receiving.worker import WorkerState
    from sqlqueue_orm.transport import Transport

#: Longest a worker waits for a free slot before it gives up this receive.
SLOT_WAIT = 0.5
#: Prefix of the global limit's lock names (PostgreSQL: hashed into the lock's first key).
LOCK_PREFIX = "sqlqueue.slots."
#: Prefix of a key's lock names: then the queue, U+001F, the key.
KEY_PREFIX = "sqlqueue.key."
#: Seconds a limit takes the slots before the rows (the global limit: its claim in a statement
#: of its own; per key: the careful path) after a receive that took both at once was refused: a
#: limit that binds costs a rolled-back receive (and psycopg its prepared statements) about once
#: in this long, not on every receive.
REFUSAL_PAUSE = 1.0

#: One group of a many-limit claim: a prefix, the names after it (each lock's name is the
#: prefix then the name) and the slots of each.
Claim = tuple[str, Collection[str], int]

_process_offset = random.randrange(1 << 16)  # noqa: S311  (spreads processes, not secrets)
_rendered_statements: dict[tuple[str, type[Dialect], str], sql.Statement] = {}


def first_slot(worker: WorkerState, limit: int) -> int:
    """The slot *worker* tries first: its number in the process, offset per process.

    Workers of one process prefer different slots, so with a limit far above the load each
    first try succeeds (one lock, no scan past slots others hold).
    """
    return (_process_offset + worker.number) % limit


def rendered(template: str, connection: Connection) -> sql.Statement:
    """*template* rendered once per dialect for its driver (hot path: the driver's cursor)."""
    dialect = connection.dialect
    key = (template, type(dialect), dialect.paramstyle)
    statement = _rendered_statements.get(key)
    if statement is None:
        statement = _rendered_statements[key] = sql.render(template, dialect, "")
    return statement


def rows(connection: Connection, template: str, values: dict[str, Any]) -> list[Any]:
    """Every row of *template* run in *connection*'s transaction, on the driver's cursor."""
    statement = rendered(template, connection)
    return connections.driver_rows(connection, statement.text, statement.params(values))


def scalar(connection: Connection, template: str, values: dict[str, Any]) -> Any:
    """The first column of the first row of *template*, as :func:`rows` runs it."""
    found = rows(connection, template, values)
    return found[0][0] if found else None


def try_slot(
    worker: WorkerState, connection: Connection, template: str, limit: int, name: str
) -> bool:
    """Take a free one of *limit* slots named *name*, for the transaction; no waiting."""
    values = {"k": limit, "name": name, "first": first_slot(worker, limit)}
    number = scalar(connection, template, values)
    return number is not None and int(number) >= 0


def try_slots(worker: WorkerState, connection: Connection, claims: list[Claim]) -> bool:
    """Take one slot of each limit of *claims* in one statement; all or False.

    On False some were taken: the caller rolls the transaction back.
    """
    statements = dialects.for_dialect(connection).flow
    assert statements is not None
    wanted = sum(len(names) for _prefix, names, _limit in claims)
    first = first_slot(worker, max(limit for _prefix, _names, limit in claims))
    template = statements.claim_slots
    values: dict[str, Any] = {"first": first}
    few = statements.few_claims
    if statements.grouped_claims and wanted < len(few):
        template = few[wanted]
        letters = iter("abcdefgh")
        for prefix, names, limit in claims:
            for name in names:
                letter = next(letters)
                values[f"name_{letter}"] = prefix + name
                values[f"k_{letter}"] = limit
    elif statements.grouped_claims:
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
    taken = scalar(connection, template, values)
    return taken is not None and int(taken) == wanted


def claiming_receive(
    transport: Transport,
    table_queue: TableQueue,
    connection: Connection,
    count: int,
    keys: bool,
    values: dict[str, Any],
) -> tuple[list[IncomingMessage], list[list[Any]]]:
    """The receive that claims slots as it takes rows, in *connection*'s transaction.

    As :meth:`Transport.receive` runs a receive: the queue's one-time checks first, and
    through the transport's instrumentation, which sees the messages taken. Returns the
    messages and each claim column as a list, one value per message
    (:meth:`~sqlqueue_orm.queuing.table_queue.TableQueue.receive_claiming`).
    """
    transport.queues.first_use(connection, table_queue)
    instrumentation = transport.instrumentation
    if instrumentation is None:
        return table_queue.receive_claiming(connection, count, keys, values)
    taken: list[IncomingMessage] = []
    columns: list[list[Any]] = []

    def proceed() -> list[IncomingMessage]:
        messages, claims = table_queue.receive_claiming(connection, count, keys, values)
        taken[:], columns[:] = messages, claims
        return messages

    # what the statement took, whatever the instrumentation returns: the columns match it
    instrumentation.receive(table_queue.name, proceed)
    return taken, columns


def put_back(
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
        connections.rollback_on_driver(connection)
    except Exception as error:  # the driver's own: its state is not known, drop it
        connection.invalidate()
        raise exceptions.DatabaseError(
            f"queue {queue}: rolling back a receive whose slot was refused failed: {error}",
            transient=True,
        ) from error
    floor = transport.queues.table_queue(queue).floor
    if floor is not None and messages:
        floor.returned(min(message.row_version for message in messages))
