"""The queues a transport has met, by address: parsed, kept and checked once.

:class:`QueueDirectory` is what every operation of :class:`~sqlqueue_orm.transport.Transport`
does before it runs a statement: parse the queue's address in the form of this database's .NET
transport (the default schema where it names none), find the queue's
:class:`~sqlqueue_orm.queuing.table_queue.TableQueue` (made once per address, and kept by the
text it was named with too) or an endpoint's
:class:`~sqlqueue_orm.queuing.delayed_table.DelayedTable`, and, on the first use of a queue,
look its table up once for the schema warnings and the probe. A transport holds one as
``transport.queues``: the transport's operations, and the package's own parts that reach a queue
through it (the endpoint, its pump and receive modes, the outbox, the error queue), call these
methods, which read only what this class sets.
"""

from __future__ import annotations

import threading

from sqlalchemy.engine import Connection, Engine

from sqlqueue_orm import addressing, db, exceptions
from sqlqueue_orm.models import delayed_table as delayed_model
from sqlqueue_orm.queuing.delayed_table import DelayedTable
from sqlqueue_orm.queuing.table_queue import TableQueue
from sqlqueue_orm.schema import SchemaInspector

#: A queue as the API takes it: its address, or the text of one.
QueueRef = str | addressing.QueueAddress


class QueueDirectory:
    """The queues of one engine by address: parsed, kept, checked on first use (see the module).

    :param engine: the database of the queues.
    :param default_schema: schema of queue addresses that name none.
    :param verify_schema: warn once per queue, on first use, about legacy table shapes.
    :param delayed_table_suffix: endpoint ``E``'s delayed table is ``E.<suffix>``.
    """

    def __init__(
        self,
        engine: Engine,
        default_schema: str | None,
        verify_schema: bool,
        delayed_table_suffix: str,
    ) -> None:
        self.engine = engine
        self.default_schema = default_schema
        self.verify_schema = verify_schema
        self.delayed_table_suffix = delayed_table_suffix
        #: Finds and looks up queue and delayed tables (the first-use checks; listings).
        self.inspector = SchemaInspector()
        self._queues: dict[addressing.QueueAddress, TableQueue] = {}
        self._by_reference: dict[QueueRef, TableQueue] = {}
        # Queues whose schema was verified (one TableQueue per address; hashed by identity,
        # cheaper per call than hashing the address).
        self._verified_queues: set[TableQueue] = set()
        self._delayed: dict[addressing.QueueAddress, DelayedTable] = {}
        self._lock = threading.Lock()

    def address(self, queue: QueueRef) -> addressing.QueueAddress:
        """Parse *queue* in the address form of this database's .NET transport.

        The default schema applies when it names none. SQL Server and SQLite read
        ``table@[schema]@[catalog]``; PostgreSQL reads ``"schema"."table"`` (and
        ``table@[schema]``): see :mod:`sqlqueue_orm.addressing`.
        """
        address = addressing.QueueAddress.coerce(queue, self.engine.dialect.name)
        if address.schema is None and self.default_schema is not None:
            address = addressing.QueueAddress(address.table, self.default_schema, address.catalog)
        return address

    def qualified(self, queue: QueueRef) -> addressing.QueueAddress:
        """*queue*'s address as written and compared (``QueueAddress.qualified``)."""
        return self.address(queue).qualified(
            self.engine.dialect.name, lambda: db.current_schema(self.engine)
        )

    def shown_name(self, queue: QueueRef) -> str:
        """*queue* as a person reads it: without its schema when that is the default one.

        ``"public"."billing"`` (the PostgreSQL transport's form, which ``NServiceBus.FailedQ``
        holds) and ``billing@[dbo]`` are shown ``billing``, as ``Transport.list_queues`` shows a
        queue of the default schema; another schema is kept (``billing@[sales]``), and a text
        that is no address is shown as it is.
        """
        try:
            address = addressing.QueueAddress.coerce(queue, self.engine.dialect.name)
        except exceptions.ConfigurationError:
            return str(queue)
        if address.schema is not None and address.catalog is None:
            default = self.default_schema or db.current_schema(self.engine)
            if address.schema == default:
                address = addressing.QueueAddress(address.table)
        return str(address)

    def table_queue(self, queue: QueueRef) -> TableQueue:
        """The :class:`TableQueue` of *queue* (cached, also by the text it was named with)."""
        table_queue = self._by_reference.get(queue)
        if table_queue is not None:
            return table_queue
        address = self.address(queue)
        with self._lock:
            table_queue = self._queues.get(address)
            if table_queue is None:
                table_queue = TableQueue(address, self.engine.dialect)
                self._queues[address] = table_queue
            if len(self._by_reference) < 10_000:
                self._by_reference[queue] = table_queue
        return table_queue

    def first_use(self, connection: Connection, table_queue: TableQueue) -> None:
        """One look-up of the queue table for both one-time checks, on *connection*.

        The schema warnings (when ``verify_schema``) and the probe (Recoverable column, row
        locks) read the same columns: the table is looked up once per queue, on whichever
        connection first uses it. Nothing is looked up once both are done.
        """
        address = table_queue.address
        verify = self.verify_schema and table_queue not in self._verified_queues
        if not verify and table_queue.probed:
            return
        with db.wrap_db_errors(table_queue.name):
            layout = self.inspector.look_up(connection, address, indexes=verify)
            if verify:
                self._verified_queues.add(table_queue)
                self.inspector.warn_about(address, layout, connection.dialect.name)
            table_queue.probe(connection, () if layout is None else layout.columns)

    def ready(self, table_queue: TableQueue) -> None:
        """:meth:`first_use` on a connection of our own, when it has not run yet."""
        if table_queue.probed and (table_queue in self._verified_queues or not self.verify_schema):
            return
        with db.reading(self.engine) as connection:  # looks, writes nothing
            self.first_use(connection, table_queue)

    # -- delayed tables --------------------------------------------------------------------
    def delayed_address(self, endpoint: QueueRef) -> addressing.QueueAddress:
        """The address of *endpoint*'s delayed table: ``<endpoint>.<suffix>``, same schema."""
        address = self.address(endpoint)
        name = delayed_model.delayed_table_name(address.table, self.delayed_table_suffix)
        return addressing.QueueAddress(name, address.schema, address.catalog)

    def delayed_table(self, endpoint: QueueRef) -> DelayedTable:
        """The :class:`DelayedTable` of *endpoint* (cached), feeding *endpoint*'s queue."""
        queue_address = self.address(endpoint)
        address = self.delayed_address(queue_address)
        with self._lock:
            table = self._delayed.get(address)
            if table is None:
                table = DelayedTable(address, queue_address, self.engine.dialect)
                self._delayed[address] = table
        return table
