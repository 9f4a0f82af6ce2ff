"""Live control of endpoints: pause, resume, change concurrency, and the log of who did it.

::

    from sqlqueue_orm import Transport, control

    transport = Transport("postgresql+psycopg://app@db/shop")
    control.pause(transport, "sales")               # every process of "sales" stops taking
    control.set_concurrency(transport, "sales", 8)  # ... and runs 8 workers once resumed
    control.resume(transport, "sales")
    control.set_concurrency(transport, "sales", None)  # back to its configured concurrency
    for action in control.log(transport, "sales"):
        print(action.at, action.action, action.who)

A change is one row of ``sqlqueue_endpoint_control`` per endpoint (its name, which is its input
queue), upserted with this database's statement (:class:`~sqlqueue_orm.dialects.control.
ControlStatements`), and one row of the action log ``sqlqueue_control_log``, in one transaction.
Every running process of the endpoint reads its row about twice a second and applies it
(:mod:`sqlqueue_orm.receiving.control`): paused, its pumps take no message (handlers in flight
finish, nothing is lost); resumed, they go on at once; a concurrency override grows or shrinks
the input queue's workers. Who made a change is an :class:`Actor`: the host and operating-system
user of the process that made it, and for the dashboard the client's address.

The tables are created on first use (and by revision ``0015_endpoint_control``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import socket
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine

from sqlqueue_orm import config, db, dialects, exceptions
from sqlqueue_orm.models import endpoint_control
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.transport import Transport

__all__ = [
    "MAX_CONCURRENCY",
    "Actor",
    "ControlState",
    "LoggedAction",
    "create_tables",
    "log",
    "pause",
    "read_control",
    "resume",
    "set_concurrency",
    "state",
    "states",
]

#: The control table (one row per controlled endpoint).
CONTROL_TABLE = endpoint_control.control_table()
#: The action log.
LOG_TABLE = endpoint_control.log_table()
#: Largest concurrency an override may set (as ``EndpointSettings.concurrency``).
MAX_CONCURRENCY = config.MAX_CONCURRENCY

_READ = sa.select(
    CONTROL_TABLE.c.paused, CONTROL_TABLE.c.concurrency, CONTROL_TABLE.c.changed_by
).where(CONTROL_TABLE.c.endpoint == sa.bindparam("endpoint"))


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who makes a change: a host and its operating-system user, and a client's address.

    :param host: the machine the change was made on.
    :param os_user: the operating-system user who ran the command (or the dashboard).
    :param client: the dashboard's client (``address:port``); ``None`` elsewhere.
    """

    host: str
    os_user: str
    client: str | None = None

    @classmethod
    def here(cls, client: str | None = None) -> Actor:
        """The host and user of this process (and *client*, the dashboard's browser)."""
        try:
            user = getpass.getuser()
        except Exception:  # no user name known to the system (a container's numeric uid)
            user = "?"
        return cls(socket.gethostname() or "?", user, client)

    def __str__(self) -> str:
        text = f"{self.os_user}@{self.host}"
        return f"{text} from {self.client}" if self.client else text


@dataclasses.dataclass(frozen=True)
class ControlState:
    """An endpoint's control row.

    :param endpoint: the endpoint's name.
    :param paused: whether its processes take no messages.
    :param concurrency: the override of its input queue's workers; ``None``: its configured one.
    :param changed_at: when it last changed (UTC).
    :param changed_by: who changed it (:class:`Actor` as text).
    """

    endpoint: str
    paused: bool
    concurrency: int | None
    changed_at: dt.datetime
    changed_by: str


@dataclasses.dataclass(frozen=True)
class LoggedAction:
    """One change in the action log: what was done to which endpoint, when, by whom.

    :param id: the log's row id (grows with each change).
    :param endpoint: the endpoint changed.
    :param action: ``pause``, ``resume``, ``concurrency N`` or ``concurrency default``.
    :param at: when (UTC).
    :param host: the host the change was made on.
    :param os_user: the operating-system user who made it.
    :param client: the dashboard client's address, or ``None``.
    """

    id: int
    endpoint: str
    action: str
    at: dt.datetime
    host: str
    os_user: str
    client: str | None

    @property
    def who(self) -> str:
        """Who made it, as :class:`Actor` says it."""
        return str(Actor(self.host, self.os_user, self.client))


def create_tables(engine: Engine, *, log_too: bool = True) -> None:
    """Create the control table (and the action log) if missing; safe when processes race."""
    tables = [CONTROL_TABLE, LOG_TABLE] if log_too else [CONTROL_TABLE]
    for table in tables:
        try:
            table.create(engine, checkfirst=True)
        except sa.exc.DBAPIError:
            # another process created it between the check and the CREATE
            if not sa.inspect(engine).has_table(table.name):
                raise


def read_control(connection: Connection, endpoint: str) -> tuple[bool, int | None, str] | None:
    """*endpoint*'s ``(paused, concurrency, changed_by)``, or ``None`` without a row.

    One primary-key lookup: what each running process of the endpoint reads twice a second.
    """
    row = connection.execute(_READ, {"endpoint": endpoint}).first()
    return None if row is None else (bool(row[0]), row[1], str(row[2]))


def read_statement(dialect: Dialect) -> sql.Statement:
    """:func:`read_control`'s primary-key read as one statement for *dialect*'s driver.

    What a running endpoint's poller runs alone, in autocommit, on the connection its
    operations threads keep (:class:`~sqlqueue_orm.ops_connection.OpsConnection`): one round
    trip. Its row is ``(paused, concurrency, changed_by)``.
    """
    preparer = dialect.identifier_preparer
    columns = ", ".join(
        preparer.quote(column.name)
        for column in (
            CONTROL_TABLE.c.paused,
            CONTROL_TABLE.c.concurrency,
            CONTROL_TABLE.c.changed_by,
        )
    )
    key = preparer.quote(CONTROL_TABLE.c.endpoint.name)
    template = f"SELECT {columns} FROM {{table}} WHERE {key} = :endpoint"
    return sql.render(template, dialect, preparer.format_table(CONTROL_TABLE))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _cut(text: str, length: int) -> str:
    return text[:length]


def _checked_name(endpoint: str) -> str:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise exceptions.ConfigurationError(f"endpoint name {endpoint!r} must name a queue")
    if len(endpoint) > endpoint_control.NAME_LENGTH:
        raise exceptions.ConfigurationError(
            f"endpoint name {endpoint[:40]!r}... is longer than "
            f"{endpoint_control.NAME_LENGTH} characters"
        )
    return endpoint


def _known(transport: Transport, endpoint: str) -> None:
    """Refuse an endpoint with neither a control row nor an input queue (a typo)."""
    if state(transport, endpoint) is not None:
        return
    try:
        transport.peek(endpoint)
    except exceptions.QueueNotFound:
        raise exceptions.ConfigurationError(
            f"unknown endpoint {endpoint!r}: no queue of that name and no control row"
        ) from None


def _change(
    transport: Transport,
    endpoint: str,
    action: str,
    statement: str,
    values: Mapping[str, object],
    by: Actor | None,
) -> ControlState:
    actor = by or Actor.here()
    at = _now()
    engine = transport.engine
    with db.wrap_db_errors(label=f"endpoint {endpoint}"):
        create_tables(engine)
        table = engine.dialect.identifier_preparer.format_table(CONTROL_TABLE)
        with engine.begin() as connection:
            connection.execute(
                sa.text(statement.format(table=table)),
                {
                    "endpoint": endpoint,
                    "changed_at": at,
                    "changed_by": _cut(str(actor), endpoint_control.CHANGED_BY_LENGTH),
                    **values,
                },
            )
            connection.execute(
                LOG_TABLE.insert().values(
                    endpoint=endpoint,
                    action=action,
                    at=at,
                    host=_cut(actor.host, endpoint_control.WHO_LENGTH),
                    os_user=_cut(actor.os_user, endpoint_control.WHO_LENGTH),
                    client=None
                    if actor.client is None
                    else _cut(actor.client, endpoint_control.WHO_LENGTH),
                )
            )
    changed = state(transport, endpoint)
    assert changed is not None
    return changed


def pause(transport: Transport, endpoint: str, *, by: Actor | None = None) -> ControlState:
    """Pause *endpoint*: within about a second no process of it takes another message.

    Handlers in flight finish; messages sent meanwhile wait in the queue.

    :param by: who pauses it (default: this process's host and user).
    :raises ConfigurationError: no queue of that name and no control row (a typo).
    """
    _known(transport, _checked_name(endpoint))
    statement = dialects.for_dialect(transport.engine).control.set_paused
    return _change(transport, endpoint, "pause", statement, {"paused": True}, by)


def resume(transport: Transport, endpoint: str, *, by: Actor | None = None) -> ControlState:
    """Resume a paused *endpoint*: its processes take messages again at their next read.

    :raises ConfigurationError: *endpoint* has no control row (it was never paused).
    """
    if state(transport, _checked_name(endpoint)) is None:
        raise exceptions.ConfigurationError(
            f"unknown endpoint {endpoint!r}: it has no control row (never paused)"
        )
    statement = dialects.for_dialect(transport.engine).control.set_paused
    return _change(transport, endpoint, "resume", statement, {"paused": False}, by)


def set_concurrency(
    transport: Transport, endpoint: str, concurrency: int | None, *, by: Actor | None = None
) -> ControlState:
    """Run *endpoint*'s input queue with *concurrency* workers in each process.

    Growing starts workers at once; shrinking lets the busy ones finish their message first.

    :param concurrency: 1 to :data:`MAX_CONCURRENCY`; ``None``: back to the configured one.
    :raises ConfigurationError: a concurrency out of range, or an unknown endpoint.
    """
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise exceptions.ConfigurationError(
            f"concurrency {concurrency!r} must be a whole number from 1 to {MAX_CONCURRENCY}"
        )
    _known(transport, _checked_name(endpoint))
    statement = dialects.for_dialect(transport.engine).control.set_concurrency
    action = "concurrency default" if concurrency is None else f"concurrency {concurrency}"
    values = {"concurrency": concurrency, "paused": False}
    return _change(transport, endpoint, action, statement, values, by)


def _state(row: Any) -> ControlState:
    endpoint, paused, concurrency, changed_at, changed_by = row
    return ControlState(endpoint, bool(paused), concurrency, changed_at, changed_by)


def state(transport: Transport, endpoint: str) -> ControlState | None:
    """*endpoint*'s control row, or ``None`` (never controlled: it runs as configured)."""
    found = states(transport, [endpoint])
    return found[0] if found else None


def states(transport: Transport, endpoints: Iterable[str] | None = None) -> list[ControlState]:
    """The control rows of *endpoints* (default: every one), by endpoint name."""
    with db.wrap_db_errors(label="endpoint control"), db.reading(transport.engine) as connection:
        if not sa.inspect(connection).has_table(CONTROL_TABLE.name):
            return []
        columns = CONTROL_TABLE.c
        query = sa.select(
            columns.endpoint,
            columns.paused,
            columns.concurrency,
            columns.changed_at,
            columns.changed_by,
        ).order_by(columns.endpoint)
        if endpoints is not None:
            query = query.where(columns.endpoint.in_(list(endpoints)))
        return [_state(row) for row in connection.execute(query)]


def log(
    transport: Transport, endpoint: str | None = None, *, limit: int = 100
) -> list[LoggedAction]:
    """The action log, newest first: *endpoint*'s changes (default: every endpoint's)."""
    with db.wrap_db_errors(label="endpoint control"), db.reading(transport.engine) as connection:
        if not sa.inspect(connection).has_table(LOG_TABLE.name):
            return []
        columns = LOG_TABLE.c
        query = (
            sa.select(
                columns.id,
                columns.endpoint,
                columns.action,
                columns.at,
                columns.host,
                columns.os_user,
                columns.client,
            )
            .order_by(columns.id.desc())
            .limit(limit)
        )
        if endpoint is not None:
            query = query.where(columns.endpoint == endpoint)
        return [LoggedAction(*row) for row in connection.execute(query)]
