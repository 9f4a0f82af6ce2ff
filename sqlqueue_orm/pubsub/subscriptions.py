"""The subscription table's statements and the per-type cache of subscribers.

:class:`SubscriptionStore` runs NServiceBus's own statements (the dialect's ``subscribe``,
``unsubscribe`` and ``subscribers`` in :mod:`sqlqueue_orm.dialects`), rendered once with the
table name quoted by SQLAlchemy, as the hot path renders its own. With a connection they run in
its transaction; without, subscribe and unsubscribe commit a short transaction of their own
(NServiceBus: ``TransactionScope(Suppress)`` on a fresh connection) and a look-up reads in
autocommit on a pooled connection of the transport's, outside any transaction: inside a handler
on SQLite it must not wait for the write lock the receive holds.

The cache (NServiceBus's ``CachedSubscriptionStore``): subscribers per published type, kept
``cache_for`` seconds (5 by default, 0 turns it off); refreshes are single-flight (one look-up
per type at a time, the others wait for it); a subscribe or unsubscribe through this store
forgets the entries of that topic at once, in this process only: other processes see it when
their entries expire.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, config, connections, db, dialects, exceptions
from sqlqueue_orm.models import subscription
from sqlqueue_orm.pubsub import topics as topic_names
from sqlqueue_orm.queuing import sql

log = logging.getLogger(__name__)

#: NServiceBus's ``CacheInvalidationPeriod`` default, in seconds.
DEFAULT_CACHE_FOR = 5.0


@dataclasses.dataclass(frozen=True)
class SubscriptionSettings:
    """Where subscriptions live and how long look-ups are cached.

    :param table: the subscription table's name (NServiceBus: ``SubscriptionRouting``); every
        endpoint of a system must use the same one.
    :param schema: its schema (default: the transport's default schema, else the database's).
    :param cache_for: seconds the subscribers of a published type are cached; 0 turns the
        cache off (``DisableSubscriptionCache``).
    """

    table: str = subscription.TABLE_NAME
    schema: str | None = None
    cache_for: float = DEFAULT_CACHE_FOR

    def __post_init__(self) -> None:
        if not isinstance(self.table, str) or not self.table.strip():
            raise exceptions.ConfigurationError(
                f"subscription table {self.table!r} must name a table"
            )
        config.seconds("cache_for", self.cache_for, minimum=0)


class _Entry:
    """The cached subscribers of one published type, refreshed by one thread at a time."""

    __slots__ = ("addresses", "at", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.addresses: list[str] | None = None
        self.at = 0.0


class SubscriptionStore:
    """Subscribe, unsubscribe and look up subscribers in one subscription table.

    :param engine: the database of the table (and of the queues).
    :param settings: table, schema and cache.
    :param own_connections: pooled connections for look-ups outside a transaction (the
        transport's); default ones of the store's own.
    :param clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        engine: Engine,
        settings: SubscriptionSettings | None = None,
        *,
        own_connections: connections.ThreadConnections | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.settings = settings or SubscriptionSettings()
        support = dialects.for_dialect(engine)
        self.address = addressing.QueueAddress(self.settings.table, self.settings.schema)
        self.address.check_for(engine.dialect.name)
        #: The table in this dialect's layout (columns keyed queue_address, endpoint, topic).
        self.table = subscription.subscription_table(
            engine, self.settings.schema, self.settings.table
        )
        self.name = str(self.address)
        dialect = engine.dialect
        quoted = sql.format_table(dialect, self.address)
        self._quoted = quoted
        self._subscribe = sql.render(support.subscribe, dialect, quoted)
        self._unsubscribe = sql.render(support.unsubscribe, dialect, quoted)
        self._subscribers_template = support.subscribers
        self._lookups: dict[int, sql.Statement] = {}
        self._connections = own_connections or connections.ThreadConnections(
            engine, support.begin, sql.for_dialect(dialect).autocommit
        )
        self._clock = clock
        self._cache: dict[tuple[str, ...], _Entry] = {}
        self._cache_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<SubscriptionStore {self.name} cache {self.settings.cache_for}s>"

    # -- installing ------------------------------------------------------------------------
    def create_table(self, connection: Connection | None = None) -> bool:
        """Create the table if it is missing (under the installers' lock); return whether it was.

        Safe to run from several processes at once, as the queue installer is.
        """
        with self._errors(), self._transaction(connection) as conn:
            dialects.for_dialect(conn).take_install_lock(conn, self.address)
            if sa.inspect(conn).has_table(self.table.name, schema=self.table.schema):
                return False
            self.table.create(conn)
        log.info("subscriptions %s: table created", self.name)
        return True

    # -- subscriptions ---------------------------------------------------------------------
    def subscribe(
        self,
        endpoint: str,
        topic: str,
        queue_address: str,
        connection: Connection | None = None,
    ) -> None:
        """Store that *endpoint* receives *topic* at *queue_address* (an upsert on both keys)."""
        for name, value in (("endpoint", endpoint), ("queue address", queue_address)):
            if not isinstance(value, str) or not value.strip() or len(value) > 200:
                raise exceptions.ConfigurationError(
                    f"subscription {name} {value!r} must be 1 to 200 characters"
                )
        values = {
            "endpoint": endpoint,
            "topic": topic_names.check_topic(topic),
            "queue_address": queue_address,
        }
        try:
            self._execute(self._subscribe, values, connection)
        finally:
            self.forget(topic)
        log.info(
            "queue %s: endpoint %s subscribed to %s (subscriptions %s)",
            queue_address,
            endpoint,
            topic,
            self.name,
        )

    def unsubscribe(self, endpoint: str, topic: str, connection: Connection | None = None) -> None:
        """Remove *endpoint*'s subscription to *topic* (nothing happens if it has none)."""
        values = {"endpoint": endpoint, "topic": topic_names.check_topic(topic)}
        try:
            self._execute(self._unsubscribe, values, connection)
        finally:
            self.forget(topic)
        log.info("subscriptions %s: endpoint %s unsubscribed from %s", self.name, endpoint, topic)

    def subscribers(
        self, topics: Sequence[str], connection: Connection | None = None
    ) -> list[str]:
        """The distinct queue addresses subscribed to any of *topics*, cached per topic list.

        *topics* are those of one published type (its own first, then its bases'): the cache
        key. With *connection* a refresh reads in its transaction.
        """
        key = tuple(dict.fromkeys(topic_names.check_topic(topic) for topic in topics))
        if not key:
            return []
        cache_for = self.settings.cache_for
        if cache_for <= 0:
            return self._look_up(key, connection)
        entry = self._cache.get(key)
        if entry is None:
            with self._cache_lock:
                entry = self._cache.setdefault(key, _Entry())
        addresses = entry.addresses
        if addresses is not None and self._clock() - entry.at < cache_for:
            return addresses
        with entry.lock:  # single-flight: one refresh per type, the others wait for it
            if entry.addresses is not None and self._clock() - entry.at < cache_for:
                return entry.addresses
            addresses = self._look_up(key, connection)
            entry.addresses, entry.at = addresses, self._clock()
            return addresses

    def forget(self, topic: str | None = None) -> None:
        """Drop the cached subscribers of every type that reaches *topic* (``None``: all)."""
        with self._cache_lock:
            for key in list(self._cache):
                if topic is None or topic in key:
                    entry = self._cache.pop(key)
                    entry.addresses = None

    def read_all(
        self, connection: Connection | None = None
    ) -> list[subscription.Subscription]:
        """Every subscription, by topic then endpoint."""
        table = self.table
        statement = sa.select(table.c.queue_address, table.c.endpoint, table.c.topic).order_by(
            table.c.topic, table.c.endpoint
        )
        with self._errors(), self._transaction(connection) as conn:
            rows = conn.execute(statement).all()
        return [subscription.Subscription(str(a), str(e), str(t)) for a, e, t in rows]

    # -- running statements ----------------------------------------------------------------
    def _look_up(self, topics: tuple[str, ...], connection: Connection | None) -> list[str]:
        statement = self._lookups.get(len(topics))
        if statement is None:
            # One parameter per topic; :name parameters are letters only (sql.render).
            names = ", ".join(f":topic_{_letters(index)}" for index in range(len(topics)))
            template = self._subscribers_template.replace("{topics}", names)
            statement = sql.render(template, self.engine.dialect, self._quoted)
            if len(self._lookups) < 64:
                self._lookups[len(topics)] = statement
        values = {f"topic_{_letters(index)}": topic for index, topic in enumerate(topics)}
        params = statement.params(values)
        with self._errors():
            if connection is not None:
                rows = connection.exec_driver_sql(statement.text, params).fetchall()
            else:
                with self._connections.statement() as cursor:
                    cursor.execute(statement.text, params)
                    rows = cursor.fetchall()
        addresses = sorted({str(row[0]) for row in rows})
        log.debug(
            "subscriptions %s: %d subscriber(s) of %s", self.name, len(addresses), topics[0]
        )
        return addresses

    def _execute(
        self, statement: sql.Statement, values: dict[str, Any], connection: Connection | None
    ) -> None:
        with self._errors(), self._transaction(connection) as conn:
            conn.exec_driver_sql(statement.text, statement.params(values))

    def _transaction(self, connection: Connection | None) -> Any:
        if connection is not None:
            return _Given(connection)
        return self.engine.begin()

    def _errors(self) -> Any:
        dbapi = getattr(self.engine.dialect, "dbapi", None)
        return db.wrap_db_errors(
            label=f"subscriptions {self.name}",
            missing_table=(
                self.name,
                "it does not exist (an endpoint creates it at start-up)",
            ),
            dbapi_error=getattr(dbapi, "Error", None),
        )


class _Given:
    """A caller's connection as a context manager that neither commits nor closes it."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def __enter__(self) -> Connection:
        return self.connection

    def __exit__(self, *exc_info: object) -> None:
        return None


def _letters(index: int) -> str:
    """0 -> ``a``, 25 -> ``z``, 26 -> ``ba``: parameter suffixes without digits."""
    text = ""
    while True:
        index, rest = divmod(index, 26)
        text = chr(ord("a") + rest) + text
        if index == 0:
            return text
