"""DelayedTable: store, move and look ahead in one ``<endpoint>.Delayed`` table, on a Connection.

NServiceBus's ``DelayedMessageTable``: a delayed send stores the message in the *sender's*
delayed table with the header ``NServiceBus.SqlServer.ForwardDestination`` naming where it goes
(the PostgreSQL transport uses the same header); when it is due, the sender's mover moves it
into the sender's input queue, whose pump forwards it there (or handles it, when that is the
sender itself). The statements are each dialect's (:mod:`sqlqueue_orm.dialects`), rendered
once with both table names quoted by SQLAlchemy. Nothing here commits.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from sqlalchemy.engine import Connection, Dialect

from sqlqueue_orm import addressing, dialects
from sqlqueue_orm.messages import PreparedMessage
from sqlqueue_orm.queuing import sql

#: The header naming a delayed message's destination (NServiceBus ``ProcessStrategy``).
FORWARD_DESTINATION = "NServiceBus.SqlServer.ForwardDestination"
#: Matured messages moved per transaction (NServiceBus ``DelayedDeliveryOptions.BatchSize``).
DEFAULT_BATCH_SIZE = 100

_NAMES = re.compile(r"\{(table|queue)\}")


def _render(template: str, dialect: Dialect, names: dict[str, str]) -> sql.Statement:
    # Rendered with placeholders left in, then both names put in one pass (a name holding the
    # other's placeholder text stays as it is).
    statement = sql.render(template, dialect, "{table}")
    text = _NAMES.sub(lambda match: names[match.group(1)], statement.text)
    return sql.Statement(text, statement.names, statement.positional)


class DelayedTable:
    """One delayed table and the input queue its matured messages move to.

    :param address: the delayed table's address (``<endpoint>.Delayed``).
    :param queue: the address of the input queue it feeds.
    :param dialect: the dialect of the connections it will be given.
    """

    def __init__(
        self,
        address: addressing.QueueAddress,
        queue: addressing.QueueAddress,
        dialect: Dialect,
    ) -> None:
        address.check_for(dialect.name)
        self.address = address
        self.queue = queue
        self.name = str(address)
        support = dialects.for_dialect(dialect)
        names = {
            "table": sql.format_table(dialect, address),
            "queue": sql.format_table(dialect, queue),
        }
        self._store = _render(support.delayed_store, dialect, names)
        self._move = [_render(text, dialect, names) for text in support.delayed_move]
        self._next_due = _render(support.delayed_next_due, dialect, names)
        self._takes_now = support.delayed_move_takes_now

    def __repr__(self) -> str:
        return f"DelayedTable({self.name!r} -> {str(self.queue)!r})"

    def store(self, connection: Connection, message: PreparedMessage, due_ms: int) -> None:
        """Insert *message* (headers already carrying the destination), due in *due_ms* ms."""
        values = {"headers": message.headers, "body": message.body, "due_ms": max(0, due_ms)}
        connection.exec_driver_sql(self._store.text, self._store.params(values))

    def move_due(self, connection: Connection, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """Move up to *batch_size* matured messages into the input queue; return how many."""
        values: dict[str, Any] = {"n": int(batch_size)}
        if self._takes_now:
            now = dt.datetime.now(dt.UTC)
            values["now"] = now.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        moved = -1
        for statement in self._move:
            result = connection.exec_driver_sql(
                statement.text, statement.params({k: values[k] for k in statement.names})
            )
            if moved < 0:
                moved = max(0, result.rowcount)
        return max(0, moved)

    def seconds_to_next_due(self, connection: Connection) -> float | None:
        """Seconds from the database's clock to the earliest due time (None: table empty)."""
        row = connection.exec_driver_sql(self._next_due.text, self._next_due.params({})).first()
        if row is None or row[0] is None:
            return None
        return float(row[0])
