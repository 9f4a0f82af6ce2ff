"""Progress of a long Spark action, logged from the driver with the queue name in each line.

Spark tasks report only when they finish, so :class:`TaskProgress` puts the action in a job
group of its own and a daemon thread polls Spark's status tracker: whenever more tasks of the
job's last stage (one per partition) are done, at most every *interval* seconds, it logs how
many, and the running count of an optional accumulator (rows sent so far). When the action
ends, the last line says every partition is done.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: Least seconds between two progress lines of one action.
PROGRESS_INTERVAL_S = 5.0
_POLL_S = 0.25


@dataclasses.dataclass(eq=False)
class TaskProgress:
    """Log the finished tasks of the Spark actions run inside this context.

    :param context: the SparkContext.
    :param queue: the queue the action works on (named in every line).
    :param action: what is being done, e.g. ``"sending"``.
    :param partitions: the partitions of the action's result (tasks of its last stage).
    :param counter: an accumulator whose value is logged as *unit* so far.
    :param unit: what *counter* counts.
    :param interval: least seconds between two lines.
    """

    context: SparkContext
    queue: str
    action: str
    partitions: int
    _: dataclasses.KW_ONLY
    counter: Any = None
    unit: str = "message(s)"
    interval: float = PROGRESS_INTERVAL_S

    def __post_init__(self) -> None:
        self.group = f"sqlqueue-{uuid.uuid4()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)
        self._logged = 0

    def __enter__(self) -> TaskProgress:
        self.context.setJobGroup(self.group, f"{self.action} {self.queue}")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
        if exc_info[0] is None:  # the action returned: every partition is done
            self._log(self.partitions)

    def finished(self) -> int:
        """Finished tasks of the last stage of this group's jobs (the result partitions)."""
        tracker = self.context.statusTracker()
        done = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None or not job.stageIds:
                continue
            stage = tracker.getStageInfo(max(job.stageIds))
            if stage is not None:
                done += stage.numCompletedTasks
        return min(done, self.partitions)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(_POLL_S):
            if time.monotonic() - last < self.interval:
                continue
            done = self.finished()
            if done and done != self._logged:
                self._log(done)
                last = time.monotonic()

    def _log(self, done: int) -> None:
        self._logged = done
        so_far = f", {int(self.counter.value)} {self.unit} so far" if self.counter else ""
        log.info("queue %s: %s: %d of %d partition(s) done%s",
                 self.queue, self.action, done, self.partitions, so_far)
