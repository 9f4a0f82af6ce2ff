"""Queue depths sampled in the dashboard's process: the last hour's chart and rate.

The library offers a queue's depth (:meth:`Transport.peek`, an estimate that costs the same at any
size) and nothing about the past, so the dashboard keeps its own history: a thread samples every
queue each ``interval`` seconds (and every page that lists queues adds its own reading). The
history starts when the dashboard starts and lives in memory only; two dashboards keep two.
The rate is the net change of the depth over the samples of the last hour, per minute: positive
when the queue grows, negative when it drains (sends minus receives, not either alone).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

log = logging.getLogger(__name__)

#: Seconds of history kept (and charted).
WINDOW = 3600.0


@dataclasses.dataclass(frozen=True)
class Sample:
    """One reading of a queue's depth at a wall-clock time (seconds since the epoch)."""

    at: float
    depth: int


class DepthSampler:
    """Keeps the last hour of depth readings per queue, read by *read_depths*.

    :param read_depths: returns ``(queue, depth)`` pairs (the dashboard passes
        :meth:`Transport.list_queues`).
    :param interval: seconds between the thread's readings.
    :param clock: the wall clock (tests pass their own).
    """

    def __init__(
        self,
        read_depths: Callable[[], Iterable[tuple[str, int]]],
        interval: float = 10.0,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.read_depths = read_depths
        self.interval = interval
        self.clock = clock
        self._history: dict[str, collections.deque[Sample]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def record(self, depths: Iterable[tuple[str, int]], at: float | None = None) -> None:
        """Add one reading of each queue in *depths*; forget readings older than an hour."""
        now = self.clock() if at is None else at
        with self._lock:
            for queue, depth in depths:
                history = self._history.setdefault(queue, collections.deque())
                history.append(Sample(now, depth))
                while history and history[0].at < now - WINDOW:
                    history.popleft()

    def series(self, queue: str) -> Sequence[Sample]:
        """The readings of *queue* in the last hour, oldest first."""
        now = self.clock()
        with self._lock:
            return [s for s in self._history.get(queue, ()) if s.at >= now - WINDOW]

    def rate(self, queue: str) -> float | None:
        """Net change of the depth per minute over the last hour (``None``: one reading or less)."""
        samples = self.series(queue)
        if len(samples) < 2 or samples[-1].at <= samples[0].at:
            return None
        return (samples[-1].depth - samples[0].depth) * 60.0 / (samples[-1].at - samples[0].at)

    def sample_once(self) -> None:
        """Read every queue's depth now and record it (a failure is logged, not raised)."""
        try:
            depths = list(self.read_depths())
        except Exception as error:
            if not self._failing:  # once per outage, not once per interval
                log.warning("dashboard: cannot sample queue depths: %s", error)
            self._failing = True
            return
        if self._failing:
            log.warning("dashboard: sampling queue depths works again")
        self._failing = False
        self.record(depths)

    def start(self) -> None:
        """Start the sampling thread (again a no-op while it runs)."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="sqlqueue-dashboard-sampler", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sampling thread and wait for it up to *timeout* seconds."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)
