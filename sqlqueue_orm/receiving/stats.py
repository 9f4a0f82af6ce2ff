"""What a pump has done since it started (:class:`PumpStats`)."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class PumpStats:
    """What a pump has done since it started (read without a lock: a snapshot may be torn)."""

    handled: int = 0
    failed: int = 0
    retried: int = 0
    #: Sent back through a delayed retry (after failing its immediate retries).
    delayed: int = 0
    expired: int = 0
    poison: int = 0
    #: Receives whose messages the handlers hold now (a batch is one); not counted while a
    #: receive runs that may find nothing.
    in_flight: int = 0
    max_in_flight: int = 0
    #: Peeks that reached the database (how often an idle queue is polled).
    peeks: int = 0
    started: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def received(self) -> int:
        """Messages taken off the queue: done with (whatever became of them) or in flight.

        A batch in flight counts one until its outcomes are counted.
        """
        return (
            self.handled
            + self.failed
            + self.retried
            + self.delayed
            + self.expired
            + self.poison
            + self.in_flight
        )

    def rate(self) -> float:
        """Messages received per second since the start."""
        elapsed = time.monotonic() - self.started
        return self.received / elapsed if elapsed > 0 else 0.0
