"""Queue depths the dashboard samples into the shared metrics table, and the readings it charts.

Running endpoints write one sample per queue they consume about once a minute
(:mod:`sqlqueue_orm.receiving.health`): depth, the age of the oldest message, processed and
failed. So that queues no endpoint of this library consumes (a .NET endpoint's, the error queue,
an audit queue) get a history too, the dashboard's thread samples every listed queue each
``interval`` seconds into the same table (``sqlqueue_queue_metrics``), as an instance of its
own: depth and oldest age only, processed and failed 0, so nothing is counted twice and a
reader takes the latest depth whoever wrote it. The history is the database's: it survives a
restart of the dashboard, and two dashboards read the same one. A database role that may not
write there logs one warning and the dashboard shows what the endpoints wrote.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable

from sqlqueue_orm import health
from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Seconds of history the queues page charts.
WINDOW = 3600.0
#: Seconds of history a queue's page shows.
DAY = health.RETENTION


@dataclasses.dataclass(frozen=True)
class Sample:
    """One reading of a number (a depth, an age, a count) at a wall-clock time."""

    at: float
    depth: float


def series(metrics: health.QueueMetrics, field: str) -> list[Sample]:
    """The readings of *field* (``depth``, ``oldest_age``, ``processed``, ``failed``)."""
    return [
        Sample(sample.at, value)
        for sample in metrics.samples
        if (value := getattr(sample, field)) is not None
    ]


class DepthSampler:
    """Writes every listed queue's depth and oldest message's age to the metrics table.

    :param transport: the dashboard's transport (the table is in its database).
    :param read_depths: returns ``(queue, depth)`` pairs (:meth:`Transport.list_queues`).
    :param interval: seconds between the thread's samples.
    """

    def __init__(
        self,
        transport: Transport,
        read_depths: Callable[[], Iterable[tuple[str, int]]],
        interval: float = health.SAMPLE_INTERVAL,
    ) -> None:
        self.transport = transport
        self.read_depths = read_depths
        self.interval = interval
        #: The dashboard's key in the metrics table.
        self.instance_id = f"dashboard-{uuid.uuid4()}"
        self._upkeep = health.TableUpkeep(
            log,
            "dashboard: cannot sample queue depths",
            "dashboard: sampling queue depths works again",
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        """Read every queue now and write the samples (a failure is logged, not raised)."""
        self._upkeep.run(self.transport.engine, self._sample)

    def _sample(self) -> None:
        engine = self.transport.engine
        now = time.time()
        samples = []
        for queue, depth in self.read_depths():
            oldest = health.oldest_age(self.transport, queue) if depth > 0 else None
            samples.append((queue, health.QueueSample(now, depth, oldest, 0, 0)))
        health.write_samples(engine, self.instance_id, samples)
        self._upkeep.prune(engine)

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
