"""The rate limit: at most N messages per interval from one queue, across processes.

:class:`RateLimit` is the shared schedule; :class:`RateLimited` applies it to any receiver
(the plain receive, or one of the concurrency limits).
"""

from __future__ import annotations

import random
import threading
import time
from typing import TYPE_CHECKING

import sqlalchemy as sa

from sqlqueue_orm import dialects, sqlalchemy_internals
from sqlqueue_orm.models import rate_limit
from sqlqueue_orm.receiving.flow import slots
from sqlqueue_orm.receiving.modes.base import Receiver

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.worker import WorkerState

#: The schedules of the rate limits (PostgreSQL, SQL Server): one row per queue, found by its
#: primary key, so the check costs the same however long the queue has run. Declared once, in
#: :mod:`sqlqueue_orm.models.rate_limit` (revision ``0012_rate_limits``).
RATE_TABLE = rate_limit.rate_limit_table()

#: Longest stretch of the schedule one reservation of a block covers.
BLOCK_SPAN = 0.02
#: How long a block's starts stay usable once it is usable; the rest are then dropped.
BLOCK_LIFE = 0.1
#: Most starts one reservation takes for the process (one message each): a batched pump far
#: below a high rate reserves once per many batches.
MAX_BLOCK = 10_000


class RateLimit:
    """At most *rate* messages per *interval* seconds from one queue, across processes.

    A shared schedule (the generic cell rate algorithm, GCRA): each receive reserves the next
    free start time, ``1 / rate`` after the previous one, and sleeps until it; a queue idle for
    a while may start *burst* messages at once. So any window of one interval holds at most
    *rate* + *burst* starts. A reservation is made at most
    :data:`~sqlqueue_orm.receiving.flow.slots.SLOT_WAIT` seconds ahead; beyond, the receive gives
    up (its message returns to the queue) and tries again.
    PostgreSQL and SQL Server: one row of ``sqlqueue_rate_limits`` per queue, created at
    start-up; SQLite: within this process.

    **Blocks** (PostgreSQL, SQL Server, a rate of 100 per second or more): one reservation
    takes the next :attr:`block` starts for this process (at most :data:`MAX_BLOCK`, covering
    at most :data:`BLOCK_SPAN` of the schedule, or a batch's size if more); its workers take
    them one by one, each sleeping until its start, and a batch as many as it may receive, up
    to what the block has left (it sleeps until the first and starts them together, as a batch
    reserved alone does). A process holds one block at a time: its
    starts not taken within :data:`BLOCK_LIFE` of the block becoming usable, or when a worker
    reserves the next block, are dropped (under-delivery, never over). A start taken late may
    bunch with later ones, so a window of one interval holds at most *rate* + *burst* starts
    plus, per process, the block less one (and never more than *rate* x :data:`BLOCK_LIFE`).
    """

    def __init__(
        self, engine: Engine, name: str, rate: int, interval: float, burst: int
    ) -> None:
        self.engine = engine
        self.name = name
        self.per_second = rate / interval
        self._step = 1 / self.per_second  # seconds between two starts
        self.burst = burst
        statements = dialects.for_dialect(engine).flow
        #: Whether the schedule is this process's alone (no table shared between processes).
        self.local = statements is None
        self._lock = threading.Lock()
        self._next_at = 0.0
        #: Starts one reservation takes for single messages (1: no blocks).
        self.block = 1 if self.local else max(
            1, min(MAX_BLOCK, int(self.per_second * BLOCK_SPAN))
        )
        # the block being used: next start (epoch seconds), starts left, used until
        self._block_next = 0.0
        self._block_left = 0
        self._block_until = 0.0
        self._statement: sa.TextClause | None = None
        #: Whether the reservation is one statement, atomic alone (run in autocommit).
        self._alone = statements is not None and statements.reserve_alone
        if statements is not None:
            table = engine.dialect.identifier_preparer.format_table(RATE_TABLE)
            self._statement = sa.text(statements.reserve.format(table=table))

    def prepare(self) -> None:
        """Create the schedule's table and row if missing (PostgreSQL, SQL Server)."""
        if self.local:
            return
        try:
            RATE_TABLE.create(self.engine, checkfirst=True)
        except sa.exc.DBAPIError:
            # another process created it between the check and the CREATE
            if not sa.inspect(self.engine).has_table(RATE_TABLE.name):
                raise
        with self.engine.begin() as connection:
            found = connection.execute(
                sa.select(RATE_TABLE.c.name).where(RATE_TABLE.c.name == self.name)
            ).first()
            if found is None:
                try:
                    with connection.begin_nested():
                        connection.execute(
                            RATE_TABLE.insert().values(name=self.name, next_at=0.0)
                        )
                except sa.exc.IntegrityError:
                    pass  # another process created it first

    def take(self, wanted: int) -> int:
        """Reserve up to *wanted* messages' starts and sleep until the first.

        :returns: how many were reserved (a batch from a block may get fewer), 0 if none is
            near.
        """
        if self.block > 1:
            return self._take_from_block(wanted)
        wait = self._reserve(wanted)
        if wait is None:
            sqlalchemy_internals.sleep(random.uniform(0.01, 0.05))  # noqa: S311  (jitter, not secrets)
            return 0
        if wait > 0:
            sqlalchemy_internals.sleep(wait)
        return wanted

    def _take_from_block(self, wanted: int) -> int:
        """Up to *wanted* starts of the process's block.

        A new block is reserved when it is used up or too old: at least :attr:`block` starts,
        or *wanted* if more.
        """
        # held across the reservation's statement: a task of the event loop waiting for it
        # lets the loop run on (the asyncio endpoint), or the holder's statement never ends
        with sqlalchemy_internals.holding(self._lock):
            now = time.time()
            if not self._block_left or now > self._block_until:
                size = max(self.block, wanted)
                wait = self._reserve(size)  # under the lock: one reservation at a time
                if wait is None:
                    self._block_left = 0
                    start = None
                else:
                    now = time.time()  # (after the round trip)
                    start = now + wait
                    # usable for BLOCK_LIFE from when it is first usable (a start in the
                    # past is idle credit, the burst)
                    self._block_until = max(start, now) + BLOCK_LIFE
                    self._block_next = start
                    self._block_left = size
            else:
                start = self._block_next
            granted = 0 if start is None else min(wanted, self._block_left)
            self._block_next += granted * self._step
            self._block_left -= granted
        if start is None:
            sqlalchemy_internals.sleep(random.uniform(0.01, 0.05))  # noqa: S311  (jitter, not secrets)
            return 0
        if start > now:  # else the start had passed at the clock read under the lock: no sleep
            wait = start - time.time()
            if wait > 0:
                sqlalchemy_internals.sleep(wait)
        return granted

    def _reserve(self, wanted: int) -> float | None:
        step = wanted / self.per_second
        tau = (self.burst - 1) / self.per_second  # an idle queue starts *burst* at once
        if self._statement is None:
            with self._lock:
                now = time.time()
                start = max(self._next_at, now - tau)
                if start - now > slots.SLOT_WAIT:
                    return None
                self._next_at = start + step
                return start - now
        values = {"name": self.name, "step": step, "tau": tau, "wait": slots.SLOT_WAIT}
        if self._alone:
            # one UPDATE, atomic alone: no BEGIN and COMMIT round trips (every worker's take
            # waits for this lock while a reservation runs)
            autocommit = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            with autocommit as connection:
                value = connection.execute(self._statement, values).scalar()
        else:
            with self.engine.begin() as connection:
                value = connection.execute(self._statement, values).scalar()
        return None if value is None else float(value)


class RateLimited(Receiver):
    """*receiver* under the rate limit *rate* (chosen at start-up, see the package docstring).

    A batch (*batch_size* above 1) takes its starts before its transaction begins, then
    receives as many messages (:attr:`WorkerState.allowance`); a single message takes its start
    after its receive, so its handler starts right after its start.
    """

    def __init__(self, receiver: Receiver, rate: RateLimit, batch_size: int) -> None:
        super().__init__(receiver.transport, receiver.queue)
        self.receiver = receiver
        self.rate = rate
        self._batched = batch_size > 1
        self._batch_size = batch_size

    def prepare(self) -> None:
        """Create the schedule's table and row if missing, then what *receiver* needs."""
        self.rate.prepare()
        self.receiver.prepare()

    def enter(self, worker: WorkerState) -> bool:
        """A batch takes its starts first (none near: no receive); then *receiver*'s."""
        if self._batched:
            granted = self.rate.take(self._batch_size)
            if not granted:
                return False
            worker.allowance = granted  # messages this receive may take
        return self.receiver.enter(worker)

    def receive(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """*receiver*'s receive."""
        return self.receiver.receive(worker, connection, count)

    def paced(self, worker: WorkerState) -> bool:
        """One message received: take its start (a batch took its starts already)."""
        if self._batched:
            return True
        return self.rate.take(1) > 0

    def leave(self, worker: WorkerState) -> None:
        """*receiver*'s leave."""
        self.receiver.leave(worker)
