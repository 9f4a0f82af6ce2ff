"""The raw driver (psycopg, sqlite3) running the very statements ``TableQueue`` renders.

Nothing here spells a column name: the INSERT and the DELETE ... RETURNING come from
``transport.queues.table_queue(name)._send`` / ``._receive_args(n)`` (what the hot path
executes), and the body is found in the result by the cursor's description. Two ways to
commit, reported apart:

* ``raw autocommit``: the statement alone, atomic by itself (what a user would hand-write for a
  single-statement operation; SQLite: no BEGIN);
* ``raw BEGIN/stmt/COMMIT``: the same statement in an explicit transaction (psycopg's implicit
  BEGIN then ``commit()``; SQLite ``BEGIN IMMEDIATE`` as our engines do), the honest baseline
  where a transaction is needed (at-least-once receive, batches).

A raw send builds its rows inside the clock, as a hand-written loop would: the same headers as
``OutgoingMessage.prepare`` (the message's own, then ``NServiceBus.MessageId`` and
``NServiceBus.TimeSent``) serialized with the standard ``json`` module in NServiceBus's format
(``/`` as ``\\/``), so the ratio measures our layer's overhead, not the work of the wire format.
A raw receive parses each row's headers with the standard
``json.loads`` into a dict, as any consumer of an NServiceBus row must, so a receive's ratio
measures our overhead (the id, the checks, the message object, SQLAlchemy), not the wire format.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from benchmarks.servers import Database
from sqlqueue_orm import OutgoingMessage, Transport, headers

#: NServiceBus's wire timestamp, as a hand-written sender would format it.
_WIRE_TIME = "%Y-%m-%d %H:%M:%S:%f Z"
#: The standard encoder, built once (``json.dumps`` with options builds one per call).
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

AUTOCOMMIT = "raw autocommit"
TRANSACTION = "raw BEGIN/stmt/COMMIT"


class RawQueue:
    """One queue table driven through a bare DB-API connection."""

    def __init__(self, database: Database, queue: str, autocommit: bool) -> None:
        with Transport(database.url) as transport:
            table_queue = transport.queues.table_queue(queue)
            with transport.engine.connect() as connection:
                table_queue.probe(connection)  # the receive statement depends on the probe
            self.table_queue = table_queue
            self.send_statement = table_queue._send
            self.peek_statement = table_queue._peek
            self.to_driver = table_queue._text.id_to_driver
        self.autocommit = autocommit
        self.sqlite = database.name == "sqlite"
        self.connection = database.raw_connect(autocommit)
        self._body_index: int | None = None
        self._headers_index = 0

    def rows(self, messages: Sequence[OutgoingMessage]) -> list[Any]:
        """Driver parameters of *messages* (bytes bodies, no TTBR), headers by ``json.dumps``.

        The headers are the message's own plus MessageId and TimeSent, in the order and the
        format ``OutgoingMessage.prepare`` writes them; run inside the clock.
        """
        params, to_driver = self.send_statement.params, self.to_driver
        rows = []
        for message in messages:
            values = dict(message.headers)
            values[headers.MESSAGE_ID] = message.message_id
            values[headers.TIME_SENT] = dt.datetime.now(dt.UTC).strftime(_WIRE_TIME)
            text = _JSON.encode(values)
            rows.append(params({
                "id": to_driver(message.id),
                "ttbr": None,
                "headers": text.replace("/", "\\/"),
                "body": message.body,
            }))
        return rows

    def send_messages(self, messages: Sequence[OutgoingMessage]) -> None:
        """Build the rows of *messages* (:meth:`rows`) and insert them (:meth:`send`)."""
        self.send(self.rows(messages))

    def send(self, rows: list[Any]) -> None:
        """Insert *rows*: one row with execute, more with executemany (one transaction)."""
        text = self.send_statement.text
        self._begin()
        cursor = self.connection.cursor()
        if len(rows) == 1:
            cursor.execute(text, rows[0])
        else:
            cursor.executemany(text, rows)
        cursor.close()
        self._commit()

    def receive(self, count: int) -> list[bytes]:
        """Delete up to *count* messages; parse each one's headers; commit; return the bodies.

        The headers are parsed by ``json.loads`` (what a consumer of the row must do at the
        least) and dropped: the loop pays for the wire format as ours does, and inside the
        transaction, as a receive in the caller's transaction builds its messages.
        """
        self._begin()
        cursor = self.connection.cursor()
        # The very statement (row limit written in) and parameters the hot path runs.
        statement, params, _many = self.table_queue._receive_args(count)
        cursor.execute(statement.text, params)
        rows = cursor.fetchall()
        if self._body_index is None and cursor.description:
            names = [column[0].lower() for column in cursor.description]
            # a column named Body, or SQLite's expression reading it raw whatever it holds
            self._body_index = next(
                i for i, name in enumerate(names) if name == "body" or '"body"' in name
            )
            # SQLite reads it as CAST("Headers" AS BLOB), so the name holds it, quoted
            self._headers_index = next(i for i, name in enumerate(names) if "headers" in name)
        cursor.close()
        index, headers, loads = self._body_index or 0, self._headers_index, json.loads
        bodies = []
        for row in rows:
            loads(row[headers])  # text (PostgreSQL) or bytes (SQLite, SQL Server): both parse
            bodies.append(bytes(row[index]))
        # After the parse, as ours hands its messages to the caller's transaction: on SQLite
        # the write lock (one per database) is held until here, on both sides.
        self._commit()
        return bodies

    def peek(self) -> int:
        """The estimated queue length, by our peek statement."""
        cursor = self.connection.cursor()
        cursor.execute(self.peek_statement.text, self.peek_statement.params({}))
        value = cursor.fetchall()[0][0]
        cursor.close()
        if not self.sqlite and not self.autocommit:
            self.connection.commit()
        return int(value or 0)

    def close(self) -> None:
        self.connection.close()

    def _begin(self) -> None:
        if self.sqlite and not self.autocommit:
            self.connection.execute("BEGIN IMMEDIATE")
        # psycopg without autocommit opens the transaction itself with the first statement

    def _commit(self) -> None:
        if self.autocommit:
            return
        if self.sqlite:
            self.connection.execute("COMMIT")
        else:
            self.connection.commit()
