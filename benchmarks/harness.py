"""What every scenario runs on: the run's sizes (:class:`Settings`) and one database's share of it
(:class:`Run`: a transport, the results, helpers to fill and drain queues).

The scenarios (:mod:`benchmarks.scenarios` and the cells of ``bench_*.py`` and
:mod:`benchmarks.instrumentation`) take a :class:`Run`; none of them is imported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator

import sqlalchemy as sa

from benchmarks import baselines, peers, workload
from benchmarks.servers import Database
from benchmarks.workload import Result
from sqlqueue_orm import OutgoingMessage, Transport

#: What ``--only`` can name.
NAMES = (
    "send", "receive", "outbox", "depth", "migrate", "pump", "instrumentation", "batch",
    "snapshot", "wakeup", "heartbeat", "groups", "asyncio", "cli",
)

_FILL_CHUNK = 5_000


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run (``--quick`` makes them smaller)."""

    messages: int = 5_000
    batch: int = 500
    consumers: tuple[int, ...] = (1, 4)
    per_transaction: tuple[int, ...] = (1, 10)
    #: Rounds the send and receive cells' messages are split in, the sides taking turns (medians).
    receive_rounds: int = 5
    shallow: int = 1_000
    deep: int = 1_000_000
    depth_receives: int = 1_000
    peek_calls: int = 200
    migrate_rows: int = 1_000_000
    #: kombu and PGQueuer take far longer per message: their cells move fewer messages.
    peer_messages: int = 1_000
    peers: bool = True
    only: frozenset[str] = frozenset(NAMES)
    #: Backlog the batched pump burns down (scenario ``batch``).
    burn_down: int = 1_000_000
    #: Scenario ``wakeup``: idle messages sent one at a time from another process; seconds of
    #: the sustained 300 msg/s; rounds of each side of the four senders, and each round's length.
    wakeup_samples: int = 400
    wakeup_seconds: float = 10.0
    sender_rounds: int = 10
    sender_seconds: float = 3.0
    #: Messages of the error queue the failure groups are timed on (scenario ``groups``).
    failed_messages: int = 100_000
    #: Rounds of the command line's start-up cell (scenario ``cli``), four processes each.
    cli_rounds: int = 15


class Run:
    """One database's share of a run: a transport, a log of results, helpers."""

    def __init__(self, database: Database, settings: Settings, results: list[Result],
                 log: Callable[[str], None]) -> None:
        self.database = database
        self.settings = settings
        self.results = results
        self.log = log
        self.transport = Transport(database.url)

    def close(self) -> None:
        self.transport.close()

    def add(self, result: Result) -> None:
        self.results.append(result)
        rate = f"{result.rate:,.0f} msg/s" if not result.skipped else f"skipped: {result.skipped}"
        self.log(f"  {self.database.name:10} {result.scenario:34} {result.side:28} {rate}")

    def skip(self, scenario: str, side: str, reason: str) -> None:
        self.add(Result(self.database.name, scenario, side, skipped=reason))

    def new_queue(self, prefix: str) -> str:
        name = f"bench_{prefix}_{uuid.uuid4().hex[:6]}"
        self.transport.create_queue(name)
        return name

    def count(self, queue: str) -> int:
        table = self.transport.queues.table_queue(queue).quoted_table.replace("%%", "%")
        with self.transport.engine.connect() as connection:
            return int(connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one())

    def replicate(self, table: str, rows: int) -> None:
        """Grow *table* to *rows* rows by copying its own rows on the server (untimed fill).

        The columns are reflected, not spelled here (the layout may change), less the identity
        (RowVersion): copies queue up behind the originals, in the same shape.
        """
        engine = self.transport.engine
        quote = engine.dialect.identifier_preparer.quote
        with engine.connect() as connection:
            columns = [
                column["name"] for column in sa.inspect(connection).get_columns(table)
                if not column.get("identity")
                and "nextval" not in str(column.get("default") or "")
                and not (column.get("primary_key") and isinstance(column["type"], sa.Integer))
            ]
        listed = ", ".join(quote(name) for name in columns)
        # Each copy a message of its own: PostgreSQL queues (NServiceBus's layout) key on id,
        # and revision 0008 refuses a table whose ids repeat. SQLite has no uuid function and
        # no key on Id: copies keep the ids there.
        fresh_id = "gen_random_uuid()" if engine.dialect.name == "postgresql" else None
        selected = ", ".join(
            fresh_id if fresh_id and name.lower() == "id" else quote(name) for name in columns
        )
        target = quote(table)
        while True:
            with engine.begin() as connection:
                have = int(connection.exec_driver_sql(
                    f"SELECT count(*) FROM {target}").scalar_one())
                if have >= rows or have == 0:
                    return
                connection.exec_driver_sql(
                    f"INSERT INTO {target} ({listed}) SELECT {selected} FROM {target} "
                    f"LIMIT {min(have, rows - have)}")
            # What autovacuum does to a queue that grew over hours: without statistics the
            # planner takes a bulk-filled million-row table for a small one, and its plan crawls.
            with engine.begin() as connection:
                connection.exec_driver_sql(f"ANALYZE {target}")

    def fill(self, queue: str, count: int, start: int = 0) -> None:
        """Put *count* messages numbered from *start* in *queue* (ours, batches; untimed)."""
        for offset in range(start, start + count, _FILL_CHUNK):
            size = min(_FILL_CHUNK, start + count - offset)
            self.transport.send_many(queue, workload.outgoing(offset, size))

    def fill_backlog(
        self, queue: str, n: int, headers: Callable[[int], dict[str, str]] | None = None
    ) -> None:
        """Empty *queue*, then fill it with *n* tiny messages: 5,000 sent, the rest copied on
        the server (the backlogs of the batch, flow and snapshot cells; untimed).

        :param headers: the extra headers of the *i*-th message sent (the copies repeat them in
            the same order).
        """
        self.transport.purge_all(queue)
        first = min(n, 5_000)
        self.transport.send_many(
            queue,
            [OutgoingMessage(b"x", headers=headers(i) if headers else {}) for i in range(first)],
        )
        if n > first:
            self.replicate(self.transport.queues.address(queue).table, n)

    def drain_bodies(self, queue: str) -> list[int]:
        """Take every message off *queue* (raw, 500 at a time); return their sequence numbers."""
        raw = baselines.RawQueue(self.database, queue, autocommit=True)
        found: list[int] = []
        while bodies := raw.receive(500):
            found.extend(workload.sequence_of(body) for body in bodies)
        raw.close()
        return found

    @contextlib.contextmanager
    def peer_failure(self, scenario: str, peer: str) -> Iterator[None]:
        """A peer that fails is reported as skipped with the reason; the run goes on."""
        try:
            yield
        except Exception as error:
            self.skip(scenario, peer, f"failed: {type(error).__name__}: {str(error)[:200]}")
            if os.environ.get("SQLQUEUE_BENCH_STRICT"):
                raise

    def peer_skipped(self, peer: str, scenario: str) -> bool:
        if not self.settings.peers:
            return True
        reason = peers.unavailable(peer, self.database)
        if reason:
            self.skip(scenario, peer, reason)
        return reason is not None

