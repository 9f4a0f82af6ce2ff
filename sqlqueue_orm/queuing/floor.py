"""The receive floor: where the head of a queue is, so receives skip the dead rows below it.

PostgreSQL keeps a deleted row, and its entry in the ``seq`` index, until vacuum removes it,
and vacuum may not remove what an open snapshot can still see (a ``REPEATABLE READ`` report,
a forgotten ``BEGIN``). Behind such a snapshot every received message leaves a dead entry at
the head of the index, and the receive (``ORDER BY seq LIMIT n``) walks all of them before the
first live row, so each receive costs more the longer the snapshot stays open. So each queue
keeps, per process, a **floor**: the receive and the peek scan from ``seq >= floor`` and skip
that dead prefix.

The floor trails the head by :attr:`ReceiveFloor.margin` rows: it moves up to (lowest row
version a receive returned) - margin, never down by itself. Rows can appear below it: a send
that took its ``seq`` before others commits after them (identity values commit out of order);
a receive rolls back (a handler failed: its immediate retry must find the message at once);
another process rolls back. None of them is lost or stranded:

* a receive from the floor that finds nothing runs again at once from 0 (the whole index), and
  a peek from the floor that finds nothing likewise; so "the queue is empty" is never the
  floor's answer;
* at least every :attr:`ReceiveFloor.rescan` seconds one receive scans from 0; a row it finds
  below the floor lowers the floor to it, so the rows after it follow in order;
* :meth:`ReceiveFloor.returned` lowers the floor at once to a message this process rolls back
  (the endpoint's strategies call it before an immediate retry; the pump calls
  :meth:`ReceiveFloor.reset` when processing fails with the transaction rolled back).

So a row below the floor waits at most ``rescan`` seconds (plus a receive), and only while
other rows are being received; the cost is one receive every ``rescan`` seconds that walks the
dead prefix. The floor is per :class:`~sqlqueue_orm.queuing.table_queue.TableQueue`, that is
per queue of one :class:`~sqlqueue_orm.Transport`; nothing is stored in the database, and .NET
endpoints on the same table run their own statements, unaffected.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

#: Rows the floor stays behind the lowest row received: walking this many dead index entries
#: is cheap, and a send committing late usually lands within them (no rescan needed).
DEFAULT_MARGIN = 1_000
#: Longest a row below the floor waits: one receive in this many seconds scans from 0.
DEFAULT_RESCAN = 2.0


class ReceiveFloor:
    """The lower bound of ``seq`` receives and peeks of one queue scan from (thread-safe).

    :param queue: the queue's name, for the log lines.
    :param margin: rows the floor stays behind the lowest row received.
    :param rescan: seconds between two receives that scan from 0 whatever the floor.
    """

    def __init__(
        self, queue: str, margin: int = DEFAULT_MARGIN, rescan: float = DEFAULT_RESCAN
    ) -> None:
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"queue {queue}: floor margin {margin!r} must be an int >= 0")
        if not rescan > 0:
            raise ValueError(f"queue {queue}: floor rescan {rescan!r} must be > 0 seconds")
        self.queue = queue
        self.margin = margin
        self.rescan = rescan
        #: Receives scan from ``seq >= position``; 0: the whole index.
        self.position = 0
        # Bumped whenever the floor is lowered: a receive that started before must not raise
        # the floor again past the row that came back (see advance()).
        self._epoch = 0
        self._rescan_at = time.monotonic() + rescan  # until then, position 0 scans anyway
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ReceiveFloor({self.queue!r}, position={self.position}, margin={self.margin})"

    def start(self) -> tuple[int, int]:
        """``(position, epoch)`` for a receive about to run: 0 when a rescan is due."""
        position = self.position
        if position and time.monotonic() >= self._rescan_at:
            # Unlocked: two threads may both take the rescan, which only costs a scan.
            self._rescan_at = time.monotonic() + self.rescan
            return 0, self._epoch
        return position, self._epoch

    def advance(self, lowest: int, epoch: int, position: int) -> None:
        """A receive that scanned from *position* returned rows, the lowest *lowest*.

        :param epoch: what :meth:`start` returned with *position*.
        """
        target = lowest - self.margin
        # (a target below 0 is 0: near the head of a new queue there is nothing to lower)
        if position == 0 and max(target, 0) < self.position:
            # A scan from 0 found a row below the floor (committed late, or rolled back where
            # nobody told us): scan from it, so the rows after it come in order.
            self._lower(target, lowest)
            return
        if target <= self.position:
            return
        with self._lock:
            if epoch == self._epoch and target > self.position:
                self.position = target

    def returned(self, row_version: int) -> None:
        """A message this process received went back to the queue (its receive rolled back).

        Call it after the rollback. Receives that started before it no longer move the floor
        up (one of them could otherwise raise it past the returned row).
        """
        with self._lock:
            self._epoch += 1
        if row_version < self.position:
            self._lower(row_version - self.margin, row_version)

    def reset(self) -> None:
        """Scan from 0 again (something rolled back and which rows is not known)."""
        if self.position:
            with self._lock:
                self.position = 0
                self._epoch += 1

    def _lower(self, target: int, row_version: int) -> None:
        with self._lock:
            if target < self.position:
                log.debug(
                    "queue %s: row %d below the receive floor %d; scanning from %d",
                    self.queue,
                    row_version,
                    self.position,
                    max(target, 0),
                )
                self.position = max(target, 0)
                self._epoch += 1
