"""The per-key concurrency limit: at most K messages of one key in flight across processes.

``key_header="customer", key_concurrency=K``: at most K messages with one value of that header
in flight, while other keys pass a slow one. Slots are the same locks as the global limit's
(:mod:`~sqlqueue_orm.receiving.flow.slots`), named after the queue and the key (on PostgreSQL
the name is hashed to 32 bits: two keys may share a limit, which can only restrict, never
exceed). The receive takes the global slot too, with the key slots. Four paths:

* **Claiming** (PostgreSQL, not ``key_fifo``; the first receive of a transaction): the receive
  takes the rows and, in the same statement, a slot of each row's key and the global slot (the
  dialect's ``receive_claiming``: the key read from the headers text in SQL, checked against
  the parsed headers afterwards).
* **Optimistic** (SQL Server, not ``key_fifo``; the first receive of a transaction): the plain
  receive (``READPAST``) takes the rows, their keys are read in Python, and ONE statement (the
  dialect's ``claim_slots``) takes a slot of every key and the global slot.
* **Leasing** (PostgreSQL, batched, a direct connection): a worker keeps its keys' slots from
  one batch to the next (:mod:`~sqlqueue_orm.receiving.flow.leases`) and claims only the keys
  new to it; a worker whose batches keep bringing keys new to it claims per transaction (the
  claiming path) until two batches in a row share most of their keys again.
* **Careful**: the global slot first, then the oldest ``key_window`` rows read without taking
  them (a plain read, pages of 10 or more), and for each, under a SAVEPOINT, the row taken by
  its native id (skipped if another receiver holds it), then a slot of its key. A busy key's
  row is released by rolling back the SAVEPOINT, and no later row of that key is tried in the
  same scan. With ``key_fifo=True`` (needs K = 1, always careful: the optimistic receive could
  take a later message of a key while another worker holds its earlier one, not yet locked) a
  key whose oldest visible row another receiver holds is also skipped for the rest of the scan,
  so its messages are handled one after the other in queue order (immediate retries included;
  a delayed retry or a move to the error queue lets the next one go).

If a claim of the first three paths is refused, the transaction, which holds nothing but those
rows and locks, is rolled back (the rows are back in their places, unhandled) and this receive,
and every receive of the process for ``REFUSAL_PAUSE`` seconds, takes the careful path. So a
limit far from binding costs no statement of its own on PostgreSQL and one per receive on SQL
Server.

A batch holds **one slot per key** however many of its messages have that key (the locks are
re-entrant within a transaction; with K > 1 a slot of the key freed by another worker while
the one statement runs may make it two, which only restricts): with K = 1 a batch may take two
messages of one key, which it handles one after the other, never at once, while no other worker
gets that key until the batch commits. A message **without the header** (one a .NET endpoint
sent) has no key: it is not limited (only by ``concurrency`` and ``global_concurrency``).
SQLite: the key slots are counted within this process (always the careful path).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from sqlqueue_orm import connections, dialects, sqlalchemy_internals
from sqlqueue_orm.receiving.flow import leases, local, slots
from sqlqueue_orm.receiving.modes.base import Receiver

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm import addressing
    from sqlqueue_orm.messages import IncomingMessage
    from sqlqueue_orm.receiving.flow.global_limit import GlobalConcurrency
    from sqlqueue_orm.receiving.worker import WorkerState
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Fewest rows read per page of the careful scan.
MIN_KEY_PAGE = 10


class KeyConcurrency(Receiver):
    """At most *limit* messages per value of the header *header* in flight (module docstring).

    :param transport: the queue's transport.
    :param queue: the queue received from (its address is part of the lock names).
    :param header: the header whose value is the key.
    :param limit: messages of one key at once.
    :param fifo: strict order per key (needs *limit* 1).
    :param window: most rows one receive looks at.
    :param gate: the global limit, whose slot the receive takes with the key slots.
    :param batched: whether the receives take batches (then, on PostgreSQL, the worker keeps
        its keys' slots from one batch to the next: :mod:`~sqlqueue_orm.receiving.flow.leases`).
    """

    def __init__(
        self,
        transport: Transport,
        queue: str | addressing.QueueAddress,
        header: str,
        limit: int,
        fifo: bool,
        window: int,
        gate: GlobalConcurrency | None = None,
        batched: bool = False,
    ) -> None:
        super().__init__(transport, queue)
        engine = transport.engine
        self.name = name = transport.address_text(queue)
        self.header = header
        self.limit = limit
        self.fifo = fifo
        self.window = window
        self.gate = gate
        #: The global limit whose slot the receive claims with the key slots (not SQLite's,
        #: which :meth:`enter` takes).
        self._global = None if gate is None or gate.local else gate
        self._statements = statements = dialects.for_dialect(engine).flow
        self.local = statements is None
        self._statement = None if statements is None else statements.claim_slot
        #: Whether a receive first takes rows as the plain receive does, then their slots
        #: (PostgreSQL, SQL Server; never with *fifo*: see the module docstring).
        self.optimistic = not self.local and not fifo
        #: Whether the receive claims the slots in its own statement (PostgreSQL).
        self._claiming = (
            self.optimistic and statements is not None and statements.receive_claiming is not None
        )
        #: Until when (monotonic) receives take the careful path (a refusal was recent; shared
        #: by every worker of the endpoint, whichever was refused).
        self._careful_until = 0.0
        #: Whether batches lease their keys' slots for the session.
        self._leasing = (
            batched and self._claiming and statements is not None and statements.lease is not None
        )
        if self._leasing:
            connections.listen_for_session_locks(engine)
        #: What each key's lock name starts with (the key follows; unit separator: PostgreSQL
        #: text has no NUL).
        self.prefix = f"{slots.KEY_PREFIX}{name}\x1f"
        self._claiming_values = {
            "prefix": self.prefix,
            "k": limit,
            # the key as our serializer and NServiceBus write it: compact, non-ASCII as itself
            "pattern": json.dumps(header, ensure_ascii=False) + ':"',
        }
        # SQLite: in flight per key, shared by every endpoint of this process on the queue
        self._counts = local.key_counts(engine, name)

    def key_of(self, message: IncomingMessage) -> str | None:
        """The message's key, or None (no header, or headers nobody can read: not limited)."""
        if message.headers_error is not None:
            return None
        return message.headers.get(self.header)

    def enter(self, worker: WorkerState) -> bool:
        """SQLite's global slot, if there is a global limit (see :class:`GlobalConcurrency`)."""
        gate = self.gate
        return True if gate is None else gate.enter(worker)

    def receive(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """Take up to *count* of the oldest messages whose key has a free slot, in order.

        Only the transaction's first receive (:attr:`WorkerState.fresh`) may roll it back, or
        take the global slot; a later receive of a batch is careful.
        """
        first = worker.fresh
        worker.fresh = False
        gate = self._global
        held = self._leases(connection) if first and self._leasing else None
        if first and self.optimistic and time.monotonic() < self._careful_until:
            # a slot was refused lately: the careful path, without a rolled-back receive, and
            # holding no lease (another worker of this process may have been the one refused)
            if held is not None:
                self._unlease(connection, held, None)
        elif held is not None and not worker.folding:
            leased = self._receive_leasing(worker, connection, count, held)
            if leased is not None:
                return leased
        elif first and self._claiming:
            if held is not None:
                self._unlease(connection, held, None)  # folding: this worker holds none
            taken, claimed = self._receive_claiming(worker, connection, count)
            if claimed:
                if held is not None:
                    self._compare_keys(worker, taken)
                return taken
            self._refused(connection, taken)
        elif first and self.optimistic:
            taken = Receiver.receive(self, worker, connection, count)
            if not taken:
                return taken
            keys = {key for message in taken if (key := self.key_of(message)) is not None}
            claims: list[slots.Claim] = []
            if keys:
                claims.append((self.prefix, keys, self.limit))
            if gate is not None:
                claims.append(("", (gate.lock_name,), gate.limit))
            if not claims or slots.try_slots(worker, connection, claims):
                return taken
            # A slot was refused: put every row back (nothing was handled) and take the
            # careful path.
            self._refused(connection, taken)
        if first and gate is not None and not gate.claim(worker, connection):
            return []
        return self._careful(worker, connection, count)

    def _refused(self, connection: Connection, taken: list[IncomingMessage]) -> None:
        """An optimistic receive's slot was refused: its rows go back.

        Receives take the careful path for ``REFUSAL_PAUSE`` seconds.
        """
        self._careful_until = time.monotonic() + slots.REFUSAL_PAUSE
        slots.put_back(self.transport, self.queue, connection, taken)

    # -- leasing -------------------------------------------------------------------------
    def _leases(self, connection: Connection) -> connections.SessionLocks | None:
        assert self._statements is not None
        return leases.of(connection, self._statements, self.name)

    def _unlease(
        self, connection: Connection, held: connections.SessionLocks, keys: Collection[str] | None
    ) -> None:
        assert self._statements is not None
        leases.give_back(connection, self._statements, held, self.prefix, keys)

    def _receive_leasing(
        self,
        worker: WorkerState,
        connection: Connection,
        count: int,
        session: connections.SessionLocks,
    ) -> list[IncomingMessage] | None:
        """The receive (with the global slot), then leases of the keys not held yet.

        Leases of keys not in this batch are given back. None: a slot was refused; the rows
        are back in their places, every lease is given back and the careful path follows.
        """
        gate = self._global
        if gate is not None and gate.receives:
            taken = gate.receive_gated(worker, connection, count)
        else:
            if gate is not None and not gate.claim(worker, connection):
                return []
            taken = Receiver.receive(self, worker, connection, count)
        if not taken:
            return taken
        held = session.held.get(self.prefix)
        if held is None:
            held = session.held[self.prefix] = {}
        wanted = self._batch_keys(taken)
        if wanted == held.keys():  # the same keys as the batch before: nothing to claim
            return taken
        new = wanted.difference(held)
        if new and held and 2 * len(new) > len(wanted):
            # most keys of this batch are new to the worker: the next claims per transaction
            worker.folding = True
            worker.last_keys = wanted
        stale = held.keys() - wanted
        if stale:
            self._unlease(connection, session, stale)
        if not new:
            return taken
        assert self._statements is not None
        if leases.lease(
            worker, connection, self._statements, held, self.prefix, self.limit, new
        ):
            return taken
        self._refused(connection, taken)
        self._unlease(connection, session, None)
        return None

    def _batch_keys(self, taken: list[IncomingMessage]) -> set[str]:
        """The keys of a batch's messages (once per batch on every worker).

        A message without the header, or whose headers could not be read (so are empty), has
        none.
        """
        header = self.header
        keys: set[str | None] = {message.headers.get(header) for message in taken}
        keys.discard(None)
        return cast("set[str]", keys)

    def _compare_keys(self, worker: WorkerState, taken: list[IncomingMessage]) -> None:
        """Folding: lease again once two batches in a row share at least half their keys."""
        keys = self._batch_keys(taken)
        last = worker.last_keys
        worker.last_keys = keys
        if keys and last is not None and 2 * len(keys & last) >= len(keys):
            worker.folding = False

    # -- claiming in the receive -----------------------------------------------------------
    def _receive_claiming(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> tuple[list[IncomingMessage], bool]:
        """The receive and its slots in one statement (the dialect's ``receive_claiming``).

        :returns: the messages, and whether every slot was taken (if not, the caller puts
            them back and takes the careful path).
        """
        gate = self._global
        limit = self.limit if gate is None else max(self.limit, gate.limit)
        values = {
            **self._claiming_values,
            "first": slots.first_slot(worker, limit),
            "gname": "" if gate is None else gate.lock_name,
            "gk": 0 if gate is None else gate.limit,
        }
        taken, columns = slots.claiming_receive(
            self.transport, self.table_queue, connection, count, True, values
        )
        if not taken:
            return taken, True
        keys, claims, global_claims = columns
        if global_claims[0] is False:  # the global slot (one claim for the statement)
            return taken, False
        missed: set[str] = set()
        header = self.header
        for message, found, claimed in zip(taken, keys, claims, strict=True):
            # as key_of, inline (once per message of a batch)
            if message.headers_error is not None or (key := message.headers.get(header)) is None:
                continue  # not limited (a lock taken for a misread key only restricts)
            if found == key:
                if not claimed:
                    return taken, False
            else:  # read otherwise in SQL: claim the key as parsed
                missed.add(key)
        if missed and not slots.try_slots(worker, connection, [(self.prefix, missed, self.limit)]):
            return taken, False
        return taken, True

    # -- careful ---------------------------------------------------------------------------
    def _careful(
        self, worker: WorkerState, connection: Connection, count: int
    ) -> list[IncomingMessage]:
        """The scan: browse the oldest rows, take each by id with its key's slot."""
        transport, queue = self.transport, self.queue
        table_queue = self.table_queue
        taken: list[IncomingMessage] = []
        blocked: set[str] = set()
        seen = 0
        after: int | None = None
        page = max(MIN_KEY_PAGE, 2 * count)
        worker.busy = False
        while len(taken) < count and seen < self.window:
            candidates = transport.browse(
                queue, min(page, self.window - seen), connection, after=after
            )
            if not candidates:
                break
            seen += len(candidates)
            after = candidates[-1].row_version
            for candidate in candidates:
                if len(taken) >= count:
                    break
                key = self.key_of(candidate)
                if key is not None and key in blocked:
                    continue
                savepoint = connection.begin_nested()
                message = table_queue.receive_by_id(connection, candidate.id)
                if message is None:  # another receiver has it (or took it already)
                    savepoint.rollback()
                    if key is not None and self.fifo:
                        blocked.add(key)
                    continue
                if key is not None and not self._claim(worker, connection, key):
                    savepoint.rollback()  # the row returns to its place
                    blocked.add(key)
                    continue
                savepoint.commit()
                taken.append(message)
        if not taken and blocked:
            log.debug("queue %s: every waiting key is at its limit", self.name)
            worker.busy = True
        return taken

    def _claim(self, worker: WorkerState, connection: Connection, key: str) -> bool:
        if self._statement is not None:
            return slots.try_slot(
                worker, connection, self._statement, self.limit, self.prefix + key
            )
        with local.lock:  # SQLite: this process's count, given back by leave()
            if self._counts.get(key, 0) >= self.limit:
                return False
            self._counts[key] = self._counts.get(key, 0) + 1
        worker.held_keys.append(key)
        return True

    def leave(self, worker: WorkerState) -> None:
        """Give back SQLite's slots this receive took; back off if every key was at its limit.

        The back-off (5 to 20 ms) keeps the pump from spinning on a queue whose every waiting
        key is at its limit.
        """
        if self.gate is not None:
            self.gate.leave(worker)
        held = worker.held_keys
        if held:
            with local.lock:
                for key in held:
                    self._counts[key] -= 1
                    if not self._counts[key]:
                        del self._counts[key]
            held.clear()
        if worker.busy:
            worker.busy = False
            sqlalchemy_internals.sleep(random.uniform(0.005, 0.02))  # noqa: S311  (jitter, not secrets)
