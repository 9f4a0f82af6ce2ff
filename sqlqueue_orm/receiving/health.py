"""The health thread of a running endpoint: its heartbeat and its queues' samples.

:class:`HealthWriter` runs beside the pumps on a thread of its own. Every
``heartbeat_interval`` seconds it writes the instance's row of ``sqlqueue_endpoints`` (host,
process, counts, rates); every ``metrics_interval`` seconds one row per pumped queue in
``sqlqueue_queue_metrics`` (depth, age of the oldest message, processed and failed since its
previous sample); every ten minutes it prunes rows older than a day
(:mod:`sqlqueue_orm.health`). Beats, depth reads and samples run as single statements in
autocommit on the connection the endpoint keeps for its operations threads
(:class:`~sqlqueue_orm.ops_connection.OpsConnection`, shared with the control poller), never
one of the workers' kept connections nor a pool checkout per beat; the pumps' counters are only
read.
A database error is logged, naming the queue, and the same write is tried again on the next
beat: the pumps never wait for this thread and never see its errors.
:meth:`HealthWriter.stop`, called once the pumps have stopped, writes a last sample and marks
the instance stopped.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlqueue_orm import health
from sqlqueue_orm.ops_connection import OpsConnection

if TYPE_CHECKING:
    from sqlqueue_orm.receiving.pump import MessagePump
    from sqlqueue_orm.receiving.settings import EndpointSettings
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)

#: Seconds of beats the rates are measured over.
RATE_WINDOW = health.RATE_WINDOW
#: Seconds :meth:`HealthWriter.stop` waits for a beat in progress (a database that hangs).
STOP_WAIT = 10.0


def _failed(pump: MessagePump) -> int:
    """Messages of *pump* that went to the error queue (failed every retry, or poison)."""
    return pump.stats.failed + pump.stats.poison


class HealthWriter:
    """Writes one endpoint instance's heartbeats and its queues' samples on its own thread.

    :param endpoint: the endpoint's name.
    :param transport: the transport of its queues (the tables are in the same database).
    :param pumps: the running pumps (the input queue's, the instance-specific queue's).
    :param settings: the endpoint's settings (``heartbeat_interval``, ``metrics_interval``).
    :param ops: the connection the endpoint's operations threads keep (its control poller's
        too), closed by its owner; ``None``: one of the writer's own, closed when it stops.
    """

    def __init__(
        self,
        endpoint: str,
        transport: Transport,
        pumps: Sequence[MessagePump],
        settings: EndpointSettings,
        ops: OpsConnection | None = None,
    ) -> None:
        assert settings.heartbeat_interval is not None
        self.endpoint = endpoint
        self.transport = transport
        self.pumps = list(pumps)
        self.interval = float(settings.heartbeat_interval)
        self.metrics_interval = float(settings.metrics_interval)
        #: This instance's key in both tables.
        self.instance_id = str(uuid.uuid4())
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._upkeep = health.TableUpkeep(
            log,
            f"queue {endpoint}: cannot write the heartbeat of endpoint {endpoint} "
            f"(instance {self.instance_id}); trying again next beat",
            f"queue {endpoint}: heartbeats are written again",
        )
        self._last_sample = float("-inf")
        # per queue: processed and failed counted in samples already written
        self._sampled = {str(pump.queue): (0, 0) for pump in self.pumps}
        self._beats: collections.deque[tuple[float, int, int]] = collections.deque()
        # A connection kept apart from the pump's: the transport's kept ones are its threads'.
        self._owns_connection = ops is None
        self._connections = OpsConnection(transport.engine) if ops is None else ops

    def start(self) -> None:
        """Start the thread; its first beat is at once."""
        self._thread = threading.Thread(
            target=self._run, name=f"{self.endpoint} health", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, write a last sample and mark the instance stopped.

        A beat still running after :data:`STOP_WAIT` seconds (the database hangs) is left to
        its thread; the instance then turns stale rather than stopped.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_WAIT)
            if thread.is_alive():
                log.warning(
                    "queue %s: the last heartbeat is still being written after %g s; "
                    "the instance will show stale, not stopped",
                    self.endpoint,
                    STOP_WAIT,
                )
                return
        self._write(final=True)
        if self._owns_connection:
            self._connections.close()  # the last sample may have taken it again

    def _run(self) -> None:
        try:
            while True:
                self._write(final=False)
                if self._stop.wait(self.interval):
                    return
        finally:
            if self._owns_connection:
                self._connections.close()  # the endpoint closes a shared one

    def _write(self, *, final: bool) -> None:
        self._upkeep.run(self.transport.engine, lambda: self._beat(final))

    def _beat(self, final: bool) -> None:
        engine = self.transport.engine
        now = time.monotonic()
        if final or now - self._last_sample >= self.metrics_interval:
            self._sample()
            self._last_sample = now
        if not final:
            self._upkeep.prune(engine)
        # the thread's beats run alone in autocommit on the connection it keeps; the last
        # one, on the stopping thread, in a transaction on one of the pool's
        health.beat(
            engine,
            self._heartbeat(now),
            state=health.STOPPED if final else health.RUNNING,
            alone=None if final else self._connections,
        )

    def _heartbeat(self, now: float) -> health.Heartbeat:
        processed = sum(pump.stats.handled for pump in self.pumps)
        failed = sum(_failed(pump) for pump in self.pumps)
        self._beats.append((now, processed, failed))
        while len(self._beats) > 2 and self._beats[1][0] <= now - RATE_WINDOW:
            self._beats.popleft()
        first_at, first_processed, first_failed = self._beats[0]
        span = now - first_at
        return health.Heartbeat(
            instance_id=self.instance_id,
            endpoint=self.endpoint,
            host=socket.gethostname(),
            process_id=os.getpid(),
            started_at=self.started_at,
            beat_interval=self.interval,
            concurrency=sum(pump.concurrency for pump in self.pumps),  # a live resize's
            in_flight=sum(pump.stats.in_flight for pump in self.pumps),
            processed=processed,
            failed=failed,
            processed_rate=(processed - first_processed) * 60.0 / span if span > 0 else 0.0,
            failed_rate=(failed - first_failed) * 60.0 / span if span > 0 else 0.0,
        )

    def _sample(self) -> None:
        """One sample per pumped queue; the counters advance only once it is written."""
        at = time.time()
        samples = []
        counted = {}
        for pump in self.pumps:
            queue = str(pump.queue)
            processed, failed = pump.stats.handled, _failed(pump)
            try:
                depth, oldest = health.read_head(self.transport, queue, self._connections)
            except Exception as error:
                log.warning("queue %s: cannot read its depth for the metrics: %s", queue, error)
                depth, oldest = None, None
            before = self._sampled[queue]
            samples.append(
                (
                    queue,
                    health.QueueSample(
                        at, depth, oldest, processed - before[0], failed - before[1]
                    ),
                )
            )
            counted[queue] = (processed, failed)
        health.write_samples(
            self.transport.engine, self.instance_id, samples, alone=self._connections
        )
        self._sampled.update(counted)
