"""A user's own application for the unit-of-work and outbox tests, and the crash helper.

``python -m tests.outbox_app URL COUNT`` commits one unit of work that saves an order and sends
COUNT messages to ``billing`` through the outbox, then kills itself with SIGKILL from the
``after_commit`` hook: after the commit, before the inline dispatch.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlqueue_orm import OutgoingMessage, Transport, headers
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.sending.outbox import Outbox
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


if __name__ == "__main__":
    crash_after_commit(sys.argv[1], int(sys.argv[2]))
