"""The circuit breaker of the pump's peek and receive, and of the delayed-message mover.

While the database fails, the failing thread backs off (doubling, capped); after
``critical_error_after`` seconds of failures in a row the breaker logs a critical error and
calls ``on_critical_error``, and keeps trying; the first success closes it again (NServiceBus's
``RepeatedFailuresOverTimeCircuitBreaker``). The breakers of one endpoint share an
:class:`Outage`: the database going away fails them all, and its critical error is raised once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING

from sqlalchemy import exc

from sqlqueue_orm import exceptions

if TYPE_CHECKING:
    from sqlqueue_orm.receiving.settings import EndpointSettings

log = logging.getLogger(__name__)

#: Errors of the database (rather than of a handler) that the circuit breakers count.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (exceptions.DatabaseError, exc.DBAPIError)


class Outage:
    """What the circuit breakers of one endpoint share: one critical error per outage.

    The first breaker failing for ``critical_error_after`` raises it; the others that get there
    while it is open only log it. The outage ends when each of them has worked again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._critical: set[CircuitBreaker] = set()

    def critical(self, breaker: CircuitBreaker) -> bool:
        """*breaker* failed for too long: whether it is the first in this outage."""
        with self._lock:
            first = not self._critical
            self._critical.add(breaker)
        return first

    def recovered(self, breaker: CircuitBreaker) -> None:
        """*breaker*, which failed for too long, works again."""
        with self._lock:
            self._critical.discard(breaker)


@dataclasses.dataclass(eq=False)
class CircuitBreaker:
    """Back off while an operation fails; raise a critical error when it fails for too long.

    :param name: what fails (``peek`` or ``receive``), for the log lines.
    :param queue: the endpoint's queue, for the log lines.
    :param settings: the endpoint's settings (backoff and ``critical_error_after``).
    :param stopping: set when the endpoint stops; it ends a backoff.
    :param on_critical_error: called with a description and the error, if callable.
    :param outage: what it shares with the endpoint's other breakers (default: its own).
    """

    name: str
    queue: str
    settings: EndpointSettings
    stopping: threading.Event
    on_critical_error: object | None
    outage: Outage = dataclasses.field(default_factory=Outage)
    #: Failures in a row.
    failures: int = dataclasses.field(default=0, init=False)
    #: Whether this run of failures raised (or logged) the critical error.
    triggered: bool = dataclasses.field(default=False, init=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _failing_since: float | None = dataclasses.field(default=None, init=False)

    @property
    def armed(self) -> bool:
        """Whether the last attempt failed."""
        return self._failing_since is not None

    def success(self) -> None:
        """The operation worked: close the breaker (logging the recovery if it was open)."""
        if self._failing_since is None:
            return
        with self._lock:
            if self._failing_since is None:
                return
            log.info(
                "queue %s: %s works again after %d failure(s) in %.1f s",
                self.queue,
                self.name,
                self.failures,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
            self.failures = 0
            if self.triggered:
                self.outage.recovered(self)
            self.triggered = False

    def failure(self, error: BaseException) -> None:
        """Count a failure, trigger the critical error when due, then back off (interruptible)."""
        now = time.monotonic()
        critical = False
        with self._lock:
            if self._failing_since is None:
                self._failing_since = now
            self.failures += 1
            failures = self.failures
            failing_for = now - self._failing_since
            if not self.triggered and failing_for >= self.settings.critical_error_after:
                self.triggered = critical = True
        delay = min(
            self.settings.max_backoff,
            self.settings.initial_backoff * 2 ** min(failures - 1, 30),
        )
        log.warning(
            "queue %s: %s failed (%d in a row, for %.1f s); trying again in %.1f s: %s",
            self.queue,
            self.name,
            failures,
            failing_for,
            delay,
            error,
        )
        if critical and not self.outage.critical(self):
            log.error(
                "queue %s: %s has failed for %.0f s as well (the critical error is raised)",
                self.queue,
                self.name,
                failing_for,
            )
        elif critical:
            description = f"Failed to {self.name} from {self.queue} for {failing_for:.0f} s"
            log.critical("queue %s: %s: %s", self.queue, description, error)
            callback = self.on_critical_error
            if callable(callback):
                try:
                    callback(description, error)
                except Exception:
                    log.exception("queue %s: on_critical_error raised", self.queue)
        self.stopping.wait(delay)
