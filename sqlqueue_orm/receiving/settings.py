"""Endpoint settings: frozen dataclasses validated when built, as in :mod:`sqlqueue_orm.config`.

A bad value raises :class:`~sqlqueue_orm.exceptions.ConfigurationError` naming it; a value that
works but is probably a mistake logs a warning, as NServiceBus's option setters do
(``QueuePeekerOptions``: a peek delay under 100 ms throws, over 10 s warns).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os

from sqlqueue_orm import config, exceptions

log = logging.getLogger(__name__)

#: NServiceBus's default ``LimitMessageProcessingConcurrencyTo``: max(logical CPUs, 2).
DEFAULT_CONCURRENCY = max(os.cpu_count() or 1, 2)
#: Shortest peek delay accepted (NServiceBus refuses less: it only stresses the database).
MIN_PEEK_DELAY = 0.1
#: Longest delay one delayed retry may wait, in seconds (NServiceBus: 24 hours).
MAX_DELAYED_RETRY = 24 * 3600.0
#: Longest peek delay accepted without a warning (messages may back up for that long).
MAX_QUIET_PEEK_DELAY = 10.0
#: Longest a batch may keep topping itself up before it commits.
MAX_BATCH_FLUSH = 0.05
#: The wake-up modes (:attr:`EndpointSettings.wakeup`).
WAKEUP_MODES = ("auto", "poll")
#: Shortest burst delay: below it an empty queue is peeked hundreds of times a second.
MIN_BURST_DELAY = 0.005


class TransactionMode(enum.Enum):
    """How the receive, the handler's data and its sends are tied together.

    See ``docs/endpoint.md`` for each mode's guarantee.
    """

    #: The row is deleted (and committed) before the handler runs: a failure loses the message.
    NONE = "none"
    #: The receive commits only when the handlers succeed; sends leave at once (ghosts on failure).
    RECEIVE_ONLY = "receive_only"
    #: Sends share the receive's transaction; the handler's ORM session commits just before it.
    SENDS_ATOMIC_WITH_RECEIVE = "sends_atomic_with_receive"
    #: The receive, the ORM session and the sends are one transaction of the endpoint's database.
    TRANSACTION_SCOPE = "transaction_scope"
    #: RECEIVE_ONLY for the input message, plus a unit of work with the outbox, de-duplicated on
    #: the incoming message id: exactly once per database.
    OUTBOX = "outbox"


def _whole(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise exceptions.ConfigurationError(
            f"{name} {value!r} must be a whole number from {low} to {high}"
        )
    return value


def _name(name: str, value: object, must: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise exceptions.ConfigurationError(f"{name} {value!r} {must}")


@dataclasses.dataclass(frozen=True)
class EndpointSettings:
    """How an endpoint's pump receives, processes, backs off and stops.

    :param concurrency: messages handled at once (``LimitMessageProcessingConcurrencyTo``),
        never exceeded; default max(CPU count, 2).
    :param transaction_mode: see :class:`TransactionMode`.
    :param peek_delay: seconds between peeks while the queue is empty (0.1 to 10 recommended).
    :param peek_batch_size: most receive tasks started per peek (``None``: one per message the
        peek counted); each task waits for a free worker.
    :param immediate_retries: times a failed message is retried at once before it is moved to
        the error queue (NServiceBus: 5). Mode NONE never retries: the message is gone.
    :param delayed_retries: times a message that failed its immediate retries is sent back
        through native delayed delivery before it goes to the error queue (NServiceBus: 3;
        0 switches them off). The count travels in the message (``NServiceBus.Retries``), so
        it survives a restart. Mode NONE never retries.
    :param delayed_retry_increase: seconds the delay grows by per delayed retry
        (NServiceBus's ``TimeIncrease``, 10 s: the retries wait 10, 20, 30 s).
    :param delayed_delivery: run the mover of ``<endpoint>.Delayed`` (and create the table
        with the queues); off, delayed sends to this endpoint and delayed retries never mature.
    :param delayed_batch_size: matured delayed messages moved per transaction (NServiceBus:
        100).
    :param error_queue: where messages that fail every retry (and poison rows) go.
    :param audit_queue: where a copy of every processed message goes, with the processing
        headers (``None``: no audit, NServiceBus's default).
    :param shutdown_timeout: seconds :meth:`Endpoint.stop` lets in-flight handlers finish; what
        is still running then is rolled back and its message returns to the queue.
    :param critical_error_after: seconds of uninterrupted peek or receive failures before the
        circuit breaker logs a critical error and calls ``on_critical_error``.
    :param initial_backoff: first wait after a peek or receive failed (doubles per failure).
    :param max_backoff: cap of that wait: how long, at most, a database that is back goes
        unnoticed.
    :param unanswered_after: seconds a statement on one of the endpoint's connections may wait
        for its result before the endpoint asks, with a new connection, whether the database
        answers at all; if that one gets no answer in as long, the endpoint logs that the
        database does not answer and drops the connections waiting (their statements fail, and
        the circuit breakers count them). A database that answers the new connection is busy,
        not gone: nothing is dropped. ``None``: never asked (the connections' own network
        timeouts still apply). Only where the driver tells a waiting connection (PostgreSQL).
        See docs/endpoint.md, "When the database does not answer".
    :param purge_expired_at_startup: delete expired messages when the endpoint starts.
    :param create_queues: create the input and error queues (and the failure groups table) at
        start-up if missing.
    :param instance_name: this instance's discriminator: the endpoint also receives on the
        instance-specific queue ``<endpoint>.<instance_name>`` (NServiceBus's uniquely
        addressable instance), created at start-up with the input queue, so replies to sends
        made with ``reply_to_this_instance=True`` come back to this instance. ``None``: none.
    :param instance_concurrency: messages of the instance-specific queue handled at once, by
        workers of its own (default 1).
    :param notify: wake an idle endpoint at once for other processes' sends (.NET endpoints
        and raw INSERTs included), instead of at its next peek. ``None`` (default): wherever
        the database and the connection can: PostgreSQL through a conditional ``NOTIFY``
        trigger (installed at start-up; it notifies only while an endpoint of the queue is
        idle and waiting), SQLite in a file by watching ``PRAGMA data_version``; not behind a
        pooler in transaction mode (detected at start: polling in bursts then), nor on SQL
        Server. ``True``: required (a :class:`ConfigurationError` at start where impossible).
        ``False``: off (in-process wake-ups and polling only). Sends of this process wake its
        endpoints on every database regardless. See docs/endpoint.md, "Wake-up and latency".
    :param batch_size: messages one transaction receives (one receive statement with this row
        limit) and handles, each under its own SAVEPOINT, committing once (1: no batching). Only
        TRANSACTION_SCOPE and OUTBOX can batch; see ``docs/scale.md``.
    :param batch_flush: seconds a batch that received fewer than ``batch_size`` messages may
        go on receiving more in the same transaction before it commits (at most 0.05).
    :param global_concurrency: messages of the queue handled at once across every process
        receiving from it (PostgreSQL, SQL Server: advisory or application locks held by the
        receive's transaction; SQLite: within this process); ``None``: no limit but
        ``concurrency`` per process. See ``docs/scale.md``.
    :param rate_limit: most messages received per ``rate_interval`` across every process on
        the queue (a token bucket: PostgreSQL and SQL Server, a row of
        ``sqlqueue_rate_limits``; SQLite: within this process); ``None``: no limit.
    :param rate_interval: seconds of the rate limit's interval (default 1).
    :param rate_burst: tokens the bucket holds at most, so messages a window may take above
        the rate (default a tenth of ``rate_limit``, at least 1).
    :param key_header: the header whose value is a message's key (a customer id, say) for the
        per-key limit; ``None``: no per-key limit. A message without it is not limited.
    :param key_concurrency: messages of one key handled at once across every process.
    :param key_fifo: handle the messages of one key strictly in queue order (needs
        ``key_concurrency=1``).
    :param key_window: oldest messages one receive looks at to find a key with a free slot.
    :param wakeup: ``"auto"`` (default): wake on this process's sends, and as *notify*
        says. ``"poll"``: for connections through a pooler in transaction mode
        (PgBouncer ``pool_mode = transaction``), where a ``LISTEN`` does not survive the
        transaction: never listen (*notify* must not be True), and poll in bursts instead: for
        *burst_window* seconds after a peek found messages, an empty peek waits only
        *burst_delay* before the next, so a stream of sends is picked up as it arrives; once
        the window passes without a message, peeks are *peek_delay* apart again.
    :param burst_delay: seconds between peeks during a burst (``wakeup="poll"``; default 0.02).
    :param burst_window: seconds a burst lasts after the last peek that found messages
        (``wakeup="poll"``; default 2).
    :param auto_subscribe: subscribe at start-up to the event types the endpoint handles
        (registered with ``handle(..., event=True)``), as NServiceBus does.
    :param heartbeat_interval: seconds between the heartbeats the endpoint writes to
        ``sqlqueue_endpoints`` on a thread of its own (``sqlqueue endpoints``, the dashboard);
        ``None``: no heartbeats and no queue metrics. See ``docs/health.md``.
    :param metrics_interval: seconds between the samples of each pumped queue (depth, oldest
        message, processed, failed) written to ``sqlqueue_queue_metrics`` (default a minute).
    """

    concurrency: int = DEFAULT_CONCURRENCY
    transaction_mode: TransactionMode = TransactionMode.TRANSACTION_SCOPE
    peek_delay: float = 1.0
    peek_batch_size: int | None = None
    immediate_retries: int = 5
    delayed_retries: int = 3
    delayed_retry_increase: float = 10.0
    delayed_delivery: bool = True
    delayed_batch_size: int = 100
    error_queue: str = "error"
    audit_queue: str | None = None
    shutdown_timeout: float = 30.0
    critical_error_after: float = 30.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    unanswered_after: float | None = 3.0
    purge_expired_at_startup: bool = False
    create_queues: bool = True
    notify: bool | None = None
    wakeup: str = "auto"
    burst_delay: float = 0.02
    burst_window: float = 2.0
    auto_subscribe: bool = True
    instance_name: str | None = None
    instance_concurrency: int = 1
    batch_size: int = 1
    batch_flush: float = 0.02
    global_concurrency: int | None = None
    rate_limit: int | None = None
    rate_interval: float = 1.0
    rate_burst: int | None = None
    key_header: str | None = None
    key_concurrency: int = 1
    key_fifo: bool = False
    key_window: int = 100
    heartbeat_interval: float | None = 5.0
    metrics_interval: float = 60.0

    def __post_init__(self) -> None:
        _whole("concurrency", self.concurrency, 1, 1_000)
        self._check_mode_and_peek()
        if self.peek_batch_size is not None:
            _whole("peek_batch_size", self.peek_batch_size, 1, 100_000)
        self._check_recoverability()
        self._check_flow_control()
        self._check_wakeup()
        self._check_timing()

    def _check_mode_and_peek(self) -> None:
        """The transaction mode (read from its name too) and the peek delay."""
        if not isinstance(self.transaction_mode, TransactionMode):
            try:
                mode = TransactionMode(str(self.transaction_mode).lower())
            except ValueError:
                raise exceptions.ConfigurationError(
                    f"transaction_mode {self.transaction_mode!r} must be one of "
                    + ", ".join(mode.value for mode in TransactionMode)
                ) from None
            object.__setattr__(self, "transaction_mode", mode)
        delay = config.seconds("peek_delay", self.peek_delay, minimum=0)
        if delay < MIN_PEEK_DELAY:
            raise exceptions.ConfigurationError(
                f"peek_delay {self.peek_delay!r} is below 0.1 seconds: it would only stress the "
                "database (choose 0.1 to 10 seconds)"
            )
        if delay > MAX_QUIET_PEEK_DELAY:
            log.warning(
                "peek_delay %ss is above 10 seconds: messages may wait that long in an idle "
                "queue (0.1 to 10 seconds is recommended)",
                self.peek_delay,
            )

    def _check_recoverability(self) -> None:
        """Retries, delayed delivery, and the error and audit queues."""
        _whole("immediate_retries", self.immediate_retries, 0, 100)
        _whole("delayed_retries", self.delayed_retries, 0, 100)
        _whole("delayed_batch_size", self.delayed_batch_size, 1, 10_000)
        config.seconds(
            "delayed_retry_increase", self.delayed_retry_increase, minimum=0, allow_equal=False
        )
        if self.delayed_retries * self.delayed_retry_increase > MAX_DELAYED_RETRY:
            raise exceptions.ConfigurationError(
                f"delayed retries of {self.delayed_retry_increase!r} s each up to "
                f"{self.delayed_retries} times would wait longer than 24 hours (NServiceBus's "
                "limit)"
            )
        if not isinstance(self.delayed_delivery, bool):
            raise exceptions.ConfigurationError(
                f"delayed_delivery {self.delayed_delivery!r} must be True or False"
            )
        _name("error_queue", self.error_queue, "must name a queue")
        if self.audit_queue is not None:
            _name("audit_queue", self.audit_queue, "must name a queue, or be None for no audit")
        if self.instance_name is not None:
            _name("instance_name", self.instance_name, "must be a non-blank name (or None)")

    def _check_flow_control(self) -> None:
        """Instance concurrency, batches, the global limit, the rate limit and keyed order."""
        _whole("instance_concurrency", self.instance_concurrency, 1, 1_000)
        _whole("batch_size", self.batch_size, 1, 10_000)
        if self.global_concurrency is not None:
            _whole("global_concurrency", self.global_concurrency, 1, 10_000)
        if self.rate_limit is not None:
            _whole("rate_limit", self.rate_limit, 1, 1_000_000)
        config.seconds("rate_interval", self.rate_interval, minimum=0, allow_equal=False)
        if self.rate_burst is not None:
            _whole("rate_burst", self.rate_burst, 1, 1_000_000)
        if self.key_header is not None:
            _name("key_header", self.key_header, "must name a header (or be None)")
        _whole("key_concurrency", self.key_concurrency, 1, 10_000)
        _whole("key_window", self.key_window, 1, 100_000)
        if not isinstance(self.key_fifo, bool):
            raise exceptions.ConfigurationError(f"key_fifo {self.key_fifo!r} must be True or False")
        if self.key_fifo and self.key_concurrency != 1:
            raise exceptions.ConfigurationError(
                f"key_fifo needs key_concurrency=1 (not {self.key_concurrency}): two messages "
                "of one key in flight at once finish in any order"
            )

    def _check_wakeup(self) -> None:
        """The batch flush, how an idle pump wakes up, and the burst after a wake-up."""
        if config.seconds("batch_flush", self.batch_flush, minimum=0) > MAX_BATCH_FLUSH:
            raise exceptions.ConfigurationError(
                f"batch_flush {self.batch_flush!r} is above 0.05 seconds: a batch holds its "
                "messages' locks and acknowledgements that long"
            )
        if self.wakeup not in WAKEUP_MODES:
            raise exceptions.ConfigurationError(
                f"wakeup {self.wakeup!r} must be one of {', '.join(WAKEUP_MODES)}"
            )
        if self.notify is not None and not isinstance(self.notify, bool):
            raise exceptions.ConfigurationError(
                f"notify {self.notify!r} must be None (where possible), True or False"
            )
        if self.wakeup == "poll" and self.notify:
            raise exceptions.ConfigurationError(
                "notify=True listens for NOTIFY, which wakeup='poll' is for connections that "
                "cannot (a pooler in transaction mode): choose one"
            )
        burst = config.seconds("burst_delay", self.burst_delay, minimum=0, allow_equal=False)
        if burst < MIN_BURST_DELAY or burst > self.peek_delay:
            raise exceptions.ConfigurationError(
                f"burst_delay {self.burst_delay!r} must be from {MIN_BURST_DELAY} seconds to "
                f"peek_delay ({self.peek_delay!r})"
            )
        config.seconds("burst_window", self.burst_window, minimum=0)

    def _check_timing(self) -> None:
        """Shutdown, back-off after errors, heartbeats and metric samples."""
        config.seconds("shutdown_timeout", self.shutdown_timeout, minimum=0)
        config.seconds("critical_error_after", self.critical_error_after, minimum=0)
        config.seconds("initial_backoff", self.initial_backoff, minimum=0, allow_equal=False)
        config.seconds("max_backoff", self.max_backoff, minimum=0, allow_equal=False)
        if self.unanswered_after is not None:
            config.seconds("unanswered_after", self.unanswered_after, minimum=0.5)
        if self.max_backoff < self.initial_backoff:
            raise exceptions.ConfigurationError(
                f"max_backoff {self.max_backoff!r} is below initial_backoff "
                f"{self.initial_backoff!r}"
            )
        if self.heartbeat_interval is not None:
            config.seconds("heartbeat_interval", self.heartbeat_interval, minimum=0.1)
        if config.seconds("metrics_interval", self.metrics_interval, minimum=0.1) < (
            self.heartbeat_interval or 0
        ):
            raise exceptions.ConfigurationError(
                f"metrics_interval {self.metrics_interval!r} is below heartbeat_interval "
                f"{self.heartbeat_interval!r}: samples are written on beats"
            )

    def replace(self, **changes: object) -> EndpointSettings:
        """A copy with *changes* applied (and validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
