"""A user's own application for the unit-of-work and outbox tests, and the crash helper.

``python -m testsupport.outbox_app URL COUNT`` commits one unit of work that saves an order and
sends COUNT messages to ``billing`` through the outbox, then kills itself with SIGKILL from the
``after_commit`` hook: after the commit, before the inline dispatch.

``python -m testsupport.outbox_app dispatch LOCAL_URL REMOTE_URL PLAN BATCH [legacy]`` dispatches
the outbox of LOCAL_URL (queue ``ledger`` routed to REMOTE_URL) and SIGKILLs itself as PLAN says:
``between:K`` when the K-th mark of a record runs (the destination committed, the mark not),
``inside:K`` at the K-th insert into ``ledger`` or ``OutboxDelivery`` (inside the destination's
transaction),
``timer:S`` after S seconds, wherever it is. ``legacy`` sends to the other database without the
delivery check, as the dispatcher did before it had one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlqueue_orm import OutgoingMessage, Transport, headers
from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox, OutboxOperation
from sqlqueue_orm.sending.routing import Routing
from sqlqueue_orm.session import UnitOfWork

REPO = Path(__file__).resolve().parent.parent


class UserBase(DeclarativeBase):
    """The user's own declarative base: nothing to do with sqlqueue_orm's."""


class Order(UserBase):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    customer: Mapped[str] = mapped_column(sa.String(100))
    total: Mapped[int]


def install(transport: Transport, *queues: str) -> Outbox:
    """Create the user's tables, the queues and OutboxData; return the outbox."""
    UserBase.metadata.create_all(transport.engine)
    for queue in queues:
        transport.create_queue(queue)
    outbox = Outbox(transport)
    outbox.create_table()
    return outbox


def count(engine: sa.Engine, table: sa.Table | type[UserBase] | str) -> int:
    """Rows in *table* (a Table, a mapped class, or a queue name)."""
    if isinstance(table, str):
        table = queue_table(table, dialect=engine)
    elif not isinstance(table, sa.Table):
        table = table.__table__  # type: ignore[assignment]
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def queue_message_ids(engine: sa.Engine, queue: str) -> list[str]:
    """NServiceBus.MessageId of every row in *queue*, in RowVersion order (rows stay put)."""
    table = queue_table(queue, dialect=engine)
    with engine.connect() as connection:
        rows = connection.execute(sa.select(table.c.Headers).order_by(table.c.RowVersion)).all()
    return [headers.deserialize(row[0])[headers.MESSAGE_ID] for row in rows]


def outbox_rows(engine: sa.Engine) -> list[tuple[str, bool, str]]:
    """(MessageId, Dispatched, Operations) of every OutboxData row."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text('SELECT "MessageId", "Dispatched", "Operations" FROM "OutboxData"')
        ).all()
    return [(str(row[0]), bool(row[1]), str(row[2])) for row in rows]


def sqlqueue_command() -> list[str]:
    """The installed ``sqlqueue`` script next to this interpreter (else ``python -m``)."""
    script = Path(sys.executable).parent / "sqlqueue"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "sqlqueue_orm.cli"]


def _die(_uow: UnitOfWork) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_after_commit(url: str, messages: int) -> None:
    """Commit an order and *messages* outbox sends, then SIGKILL this process."""
    transport = Transport(url)
    with UnitOfWork(transport, mode="outbox", after_commit=_die) as uow:
        uow.session.add(Order(customer="crash", total=messages))
        for number in range(messages):
            uow.send("billing", OutgoingMessage(f"invoice {number}", message_id=f"crash-{number}"))
    raise SystemExit("still alive after SIGKILL")


def _send_without_check(
    self: Outbox, destination: str, items: Sequence[tuple[str, OutboxOperation]]
) -> tuple[int, int]:
    # The send to another database as it was before OutboxDelivery: commit there, nothing else.
    transport = self.router.transport_for(destination)
    with transport.engine.begin() as connection:
        messages = [op.prepare() for _, op in items]
        transport.queues.table_queue(destination).send(connection, messages)
    return len(items), 0


def _kill_at(engine: sa.Engine, markers: tuple[str, ...], nth: int) -> None:
    seen = 0

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        nonlocal seen
        if statement.lstrip().startswith(markers):
            seen += 1
            if seen >= nth:
                _die(None)  # type: ignore[arg-type]

    sa.event.listen(engine, "before_cursor_execute", before)


def dispatch_until_killed(
    local_url: str, remote_url: str, plan: str, batch: int, legacy: bool = False
) -> None:
    """Dispatch the outbox of *local_url* and SIGKILL this process as *plan* says."""
    if legacy:
        Outbox._send_remote = _send_without_check  # type: ignore[method-assign]
    transport = Transport(local_url)
    outbox = Outbox(transport, Routing({"ledger": remote_url}))
    remote = outbox.router.transport_for("ledger")
    kind, _, value = plan.partition(":")
    if kind == "between":
        _kill_at(transport.engine, ('UPDATE "OutboxData" SET "Dispatched"=',), int(value))
    elif kind == "inside":
        markers = ('INSERT INTO "ledger"', 'INSERT INTO "OutboxDelivery"')
        _kill_at(remote.engine, markers, int(value))
    else:
        threading.Timer(float(value), _die, [None]).start()
    settings = DispatcherSettings(batch_size=batch, grace_period=0, retry_delay=0)
    OutboxDispatcher(outbox, settings).dispatch_pending()
    print("finished without being killed")


if __name__ == "__main__":
    if sys.argv[1] == "dispatch":
        dispatch_until_killed(
            sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6:] == ["legacy"]
        )
    else:
        crash_after_commit(sys.argv[1], int(sys.argv[2]))
