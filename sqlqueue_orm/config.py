"""Settings: frozen dataclasses validated when built, so a bad value fails at start-up, by name.

Each ``__post_init__`` raises :class:`~sqlqueue_orm.exceptions.ConfigurationError` naming the bad
value, and logs a warning for values that work but are probably a mistake (as NServiceBus's
option setters do).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import re

from sqlqueue_orm import exceptions

log = logging.getLogger(__name__)

# Fixed values the command line shows in its help and checks its arguments against. They live
# here, in a module that needs no SQLAlchemy, so that building the ``sqlqueue`` parser imports
# none; the modules they belong to re-bind them (tests/unit/test_cli_imports.py checks the two
# that are keys of a mapping there).

#: Default URL of the CLI and the demo: an embedded SQLite file in the working directory.
DEFAULT_URL = "sqlite:///sqlqueue.db"
#: The supported dialects, by SQLAlchemy's name (the keys of ``dialects.ALL``).
DIALECT_NAMES = ("mssql", "postgresql", "sqlite")
#: SQL Server versions a DDL script can target, by year, and the major version of each.
SQL_SERVER_MAJOR = {2016: 13, 2017: 14, 2019: 15, 2022: 16}
#: Largest concurrency a live override may set (as ``EndpointSettings.concurrency``).
MAX_CONCURRENCY = 1_000
#: The states of an endpoint instance, read from its heartbeats.
RUNNING, STALE, STOPPED = "running", "stale", "stopped"
#: The groupings of failed messages, by the name the CLI and the dashboard use (the keys of
#: ``recoverability.groups.GROUPINGS``).
FAILURE_GROUPINGS = ("type", "endpoint", "message-type")
#: NServiceBus's default subscription table name (``SubscriptionOptions.SubscriptionTableName``).
SUBSCRIPTION_TABLE = "SubscriptionRouting"

#: SQL Server table layouts: Index_RowVersion clustered (default), or a heap as NServiceBus 8+.
SQL_SERVER_LAYOUTS = ("clustered", "heap")

#: Outbox cleanup batch: below 5,000 row locks, so SQL Server never escalates to a table lock
#: (NServiceBus SQL persistence deletes 4,000 at a time for the same reason).
CLEANUP_BATCH_SIZE = 4_000
#: How long dispatched outbox records are kept by default (NServiceBus: 7 days).
CLEANUP_OLDER_THAN = dt.timedelta(days=7)

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_duration(text: str) -> dt.timedelta:
    """Parse ``45s``, ``30m``, ``12h``, ``7d`` or ``2w`` into a timedelta.

    :param text: a whole number followed by one unit letter.
    :raises ConfigurationError: naming *text* when it is not in that form.
    """
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise exceptions.ConfigurationError(
            f"duration {text!r} is not a whole number followed by s, m, h, d or w "
            "(for example 45s, 30m, 12h, 7d)"
        )
    amount, unit = int(match.group(1)), match.group(2).lower()
    return dt.timedelta(seconds=amount * _UNIT_SECONDS[unit])


def seconds(name: str, value: object, *, minimum: float, allow_equal: bool = True) -> float:
    """*value* as a finite number of seconds above *minimum* (or equal, if *allow_equal*).

    :raises ConfigurationError: naming the setting *name* and the bad value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise exceptions.ConfigurationError(f"{name} {value!r} is not a finite number of seconds")
    if value < minimum or (value == minimum and not allow_equal):
        bound = f"at least {minimum:g}" if allow_equal else f"more than {minimum:g}"
        raise exceptions.ConfigurationError(f"{name} {value!r} must be {bound} seconds")
    return float(value)


@dataclasses.dataclass(frozen=True)
class QueueSettings:
    """How queue tables are created.

    :param sql_server_layout: SQL Server only (other dialects ignore it). ``"clustered"``
        (default): ``Index_RowVersion`` is the clustered index, with
        ``OPTIMIZE_FOR_SEQUENTIAL_KEY = ON`` from SQL Server 2019. ``"heap"``: the layout
        NServiceBus 8+ creates, a heap with a NONCLUSTERED ``Index_RowVersion``; choose it for
        tables shared with .NET endpoints, which warn at every start-up about a clustered one.
    """

    sql_server_layout: str = "clustered"

    def __post_init__(self) -> None:
        if self.sql_server_layout not in SQL_SERVER_LAYOUTS:
            raise exceptions.ConfigurationError(
                f"sql_server_layout {self.sql_server_layout!r} must be one of "
                + ", ".join(repr(layout) for layout in SQL_SERVER_LAYOUTS)
            )


@dataclasses.dataclass(frozen=True)
class DispatcherSettings:
    """How the outbox dispatcher claims, paces and retries.

    :param batch_size: outbox records claimed (and committed) per transaction.
    :param interval: seconds to wait when nothing is due before looking again.
    :param grace_period: seconds a record is left to the inline dispatch of the unit of work
        that stored it before the dispatcher claims it (0 in tests).
    :param retry_delay: seconds a record whose dispatch failed waits before it is tried again.
    :param initial_backoff: first wait after the database failed (doubles on each failure).
    :param max_backoff: cap of that wait.
    """

    # Alike PumpStats (receiving/stats.py) only in shape: named numbers with their defaults.
    batch_size: int = 100
    interval: float = 1.0
    grace_period: float = 10.0
    retry_delay: float = 30.0
    initial_backoff: float = 0.5
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 10_000:
            raise exceptions.ConfigurationError(
                f"batch_size {size!r} must be a whole number from 1 to 10000"
            )
        seconds("interval", self.interval, minimum=0, allow_equal=False)
        seconds("grace_period", self.grace_period, minimum=0, allow_equal=True)
        seconds("retry_delay", self.retry_delay, minimum=0, allow_equal=True)
        seconds("initial_backoff", self.initial_backoff, minimum=0, allow_equal=False)
        seconds("max_backoff", self.max_backoff, minimum=0, allow_equal=False)
        if self.max_backoff < self.initial_backoff:
            raise exceptions.ConfigurationError(
                f"max_backoff {self.max_backoff!r} is below initial_backoff "
                f"{self.initial_backoff!r}"
            )
        if self.interval > 300:
            log.warning(
                "dispatcher interval %ss: committed messages may wait that long", self.interval
            )
        if size > 1_000:
            log.warning(
                "dispatcher batch_size %d: one transaction holds that many row locks; "
                "SQL Server escalates to a table lock at about 5,000",
                size,
            )


@dataclasses.dataclass(frozen=True)
class CleanupSettings:
    """What ``sqlqueue outbox cleanup`` deletes, and how many rows per transaction.

    :param older_than: dispatched records older than this are deleted.
    :param batch_size: rows per delete (4,000 keeps SQL Server from escalating locks).
    """

    older_than: dt.timedelta = CLEANUP_OLDER_THAN
    batch_size: int = CLEANUP_BATCH_SIZE

    def __post_init__(self) -> None:
        if not isinstance(self.older_than, dt.timedelta) or self.older_than < dt.timedelta(0):
            raise exceptions.ConfigurationError(
                f"older_than {self.older_than!r} must be a timedelta of zero or more"
            )
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 100_000:
            raise exceptions.ConfigurationError(
                f"batch_size {size!r} must be a whole number from 1 to 100000"
            )
        if size > 4_999:
            log.warning(
                "outbox cleanup batch_size %d: SQL Server escalates to a table lock at about "
                "5,000 row locks, blocking stores while it deletes",
                size,
            )
