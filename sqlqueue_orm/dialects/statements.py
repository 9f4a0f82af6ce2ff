"""The statement groups a dialect states, one frozen instance each per dialect.

They are fields of :class:`~sqlqueue_orm.dialects.base.DialectSupport`: :class:`SqlText` (the
hot path: send, receive, peek, purge),
:class:`NotifyWakeup` (``LISTEN``/``NOTIFY``), :class:`SessionLock` and :class:`StreamFence`
(the Spark stream's single reader and its offsets, found as :class:`FenceKind` says).

Each dialect module states its own instances; the groups of the services built on the queues
have modules of their own (:mod:`~sqlqueue_orm.dialects.flow`,
:mod:`~sqlqueue_orm.dialects.control`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import uuid
from collections.abc import Callable
from typing import Any


class FenceKind(enum.Enum):
    """How a stream reader finds the offset at or below which every row has committed."""

    #: Writers commit one at a time, in order: the highest committed value is the fence.
    HIGHEST = "highest"
    #: A range scan under shared locks (:attr:`StreamFence.scan_hint`) waits for rows still
    #: being inserted above the start.
    LOCKING_SCAN = "locking_scan"
    #: A value seen becomes the fence once every transaction in flight when it was seen has
    #: ended (:attr:`StreamFence.snapshot`, :attr:`StreamFence.in_progress`).
    SNAPSHOT = "snapshot"


@dataclasses.dataclass(frozen=True)
class SqlText:
    """The hot path's statements on one dialect. ``None``: the dialect has no such variant.

    Templates use ``{table}`` for the queue table and ``:name`` for parameters;
    :func:`sqlqueue_orm.queuing.sql.render` renders them once per queue.
    """

    send: str
    send_without_recoverable: str
    receive: str
    peek: str
    purge_expired: str
    purge_all: str
    #: Receive and purge for a role without UPDATE privilege (PostgreSQL): skips rows other
    #: receivers hold with transaction-scoped advisory locks instead of FOR UPDATE SKIP LOCKED.
    receive_without_row_locks: str | None = None
    purge_expired_without_row_locks: str | None = None
    #: Whether this role may lock the queue's rows (``:t``: the quoted table, as a value); asked
    #: once per queue where the statements above exist.
    update_privilege: str | None = None
    #: Columns the statements need; a table without them is reported as outdated, not retried.
    required_columns: tuple[str, ...] = ()
    #: Whether send skips a row whose id is already queued (its row count then says so).
    send_skips_duplicates: bool = False
    #: How native ids go to and come back from the driver.
    id_to_driver: Callable[[uuid.UUID], Any] = str
    #: The stored value of a column (``"Id"``, ``"Body"``, ``"Expires"``) from what a receive or
    #: a browse returned for it where it could not be read the fast way (for the receive's
    #: expired column, a value neither 0 nor 1): :mod:`sqlqueue_orm.queuing.rows`.
    stored_value: Callable[[str, Any], object] = lambda column, value: value
    #: How the receive's Headers column is encoded when it comes back as bytes.
    headers_encoding: str = "utf-8"
    #: How a plain SELECT reads the Headers column (``{headers}``: its quoted name) so that
    #: the driver cannot fail decoding it, as the receive reads it.
    headers_read: str = "{headers}"
    #: How a plain SELECT reads Id, Body and Expires (``{id}``, ``{body}``, ``{expires}``) so
    #: that the driver cannot fail on a value not of the column's type, as the receive reads
    #: them (see :attr:`stored_value`).
    id_read: str = "{id}"
    body_read: str = "{body}"
    #: The receive's expired column as a plain SELECT reads it (``{expires}``: the quoted
    #: Expires): whether the message expired, computed by the database as the receive does
    #: (the driver never converts a date it may not hold, PostgreSQL's ``infinity``).
    expired_read: str = (
        "CASE WHEN {expires} IS NULL THEN 0 WHEN {expires} > CURRENT_TIMESTAMP THEN 0 ELSE 1 END"
    )
    #: How one statement of the transport's own runs without BEGIN/COMMIT around it (see
    #: :class:`sqlqueue_orm.connections.OwnStatement`): ``"driver"`` sets the DBAPI
    #: connection's ``autocommit`` flag (psycopg, pyodbc); ``"implicit"``: the driver already
    #: commits each statement by itself (sqlite3 with ``isolation_level=None``).
    autocommit: str = "driver"
    # Max rows one receive may ask for (SQL Server: TOP takes a bigint; keep batches sane).
    max_batch: int = 10_000
    #: Take one row by its native id (``:id``) as the receive takes rows, same columns out:
    #: locked with the receive's hints and skipped if another transaction holds it, so two
    #: operators retrying or deleting one error-queue message cannot both take it.
    receive_by_id: str = ""
    #: The receive, its advisory-lock variant and the peek scanning the queue from a lower
    #: bound of the row version (``:floor``, 0 for the whole queue), so that the dead index
    #: entries a long-held snapshot keeps below the head are skipped
    #: (:mod:`sqlqueue_orm.queuing.floor`). None: the dialect has no such dead prefix.
    receive_from_floor: str | None = None
    receive_without_row_locks_from_floor: str | None = None
    peek_from_floor: str | None = None


def _squeezed(text: str) -> str:
    """*text* without white space, in lower case (catalog text compared with ours)."""
    return "".join(text.split()).lower()


@dataclasses.dataclass(frozen=True, kw_only=True)
class NotifyWakeup:
    """Idle receivers woken by ``LISTEN``/``NOTIFY`` (:mod:`sqlqueue_orm.receiving.wakeup`).

    A statement-level trigger on each queue table notifies :attr:`channel` with the table's
    name; ``{table}`` is the queue table, quoted by SQLAlchemy's identifier preparer.
    """

    #: The channel every queue table's trigger notifies; the payload is the table's name.
    channel: str
    #: The trigger's name on every queue table, and the function it calls.
    trigger: str
    function: str
    #: The call the trigger function makes (``sqlqueue verify`` looks for it in the function).
    notify_call: str
    #: Creates (or replaces) the trigger function.
    create_function: str
    #: Serializes installers of the function (``:key``: the function's name).
    install_lock: str
    drop_trigger: str
    #: ``{table}`` and ``{when}``: the slots' checks (:meth:`trigger_statement`).
    create_trigger: str
    #: The trigger's test of one slot, ``{slot}`` and ``{table_key}`` integer literals: false
    #: when a waiter holds it; joined with :attr:`slot_join` for every slot.
    slot_check: str
    slot_join: str
    #: Registers a waiter on one slot (true: registered), one expression per slot tried in
    #: turn; :attr:`unregister` releases it.
    register: str
    unregister: str
    #: The first slot's key; the slots are ``slot_namespace + 0 .. slots - 1``.
    slot_namespace: int
    slots: int
    #: Run on the listener's own connection, in autocommit.
    listen: str
    #: The trigger ``:trigger`` on ``:table`` (quoted): its definition and its function's source.
    trigger_catalog: str
    #: The schema and name of the table ``:table`` (quoted) as the catalog spells them.
    table_identity: str
    #: The server process of this session (a pooler in transaction mode changes it).
    backend_pid: str
    #: In the error of a trigger the role may not create (it does not own the table).
    cannot_create_markers: tuple[str, ...]

    @staticmethod
    def table_key(schema: str, name: str) -> int:
        """The queue's second lock key: a stable 31-bit hash of *schema*.*name*.

        Computed in Python, not by the server, so the trigger (the key baked in at install)
        and the waiters agree without a catalog lookup per registration; the names are the
        catalog's (:attr:`table_identity`), so two spellings of one address share a key.
        Never negative: the catalog prints a negative literal as a cast, which would not
        compare equal with the statement installed.
        """
        digest = hashlib.blake2b(f"{schema}.{name}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") & 0x7FFF_FFFF

    def trigger_is_current(self, definition: str, source: str, table_key: int) -> bool:
        """Whether a trigger's *definition* and its function's *source* are the current ones."""
        normalised = _squeezed(definition)
        return (
            "AFTER INSERT ON" in definition
            and "FOR EACH STATEMENT" in definition
            and f"{self.function}()" in definition
            and _squeezed(self.notify_call) in _squeezed(source)
            and all(
                _squeezed(self.slot_check.format(slot=slot, table_key=table_key)) in normalised
                for slot in self.slot_keys()
            )
            # no more slots than ours either: each costs every send a lock try
            and normalised.count(_squeezed(self.slot_check.split("(")[0]) + "(") == self.slots
        )

    def slot_keys(self) -> tuple[int, ...]:
        """The first key of each waiter slot."""
        return tuple(self.slot_namespace + slot for slot in range(self.slots))

    def trigger_condition(self, table_key: int) -> str:
        """The trigger's ``WHEN`` test, *table_key* baked in: every slot free of waiters."""
        return self.slot_join.join(
            self.slot_check.format(slot=slot, table_key=int(table_key))
            for slot in self.slot_keys()
        )

    def trigger_statement(self, table: str, table_key: int) -> str:
        """``CREATE TRIGGER`` on *table* (quoted) for the table's key *table_key*."""
        return self.create_trigger.format(table=table, when=self.trigger_condition(table_key))

    def register_statement(self, table_key: int) -> str:
        """One ``SELECT`` trying each slot in turn: the slot's key taken, or NULL for none."""
        tries = " ".join(
            f"WHEN {self.register.format(slot=slot, table_key=int(table_key))} THEN {slot}"
            for slot in self.slot_keys()
        )
        return f"SELECT CASE {tries} END"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionLock:
    """A lock owned by a connection (session), taken without waiting: ``:resource`` bound."""

    acquire: str
    release: str
    #: Whether the scalar :attr:`acquire` returned means the lock was granted.
    granted: Callable[[Any], bool]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamFence:
    """How a Spark stream reader finds its end offset (a RowVersion nothing commits below)."""

    kind: FenceKind
    #: :attr:`FenceKind.LOCKING_SCAN`: the table hint of the range scan.
    scan_hint: str | None = None
    #: :attr:`FenceKind.SNAPSHOT`: the current snapshot, as text.
    snapshot: str | None = None
    #: :attr:`FenceKind.SNAPSHOT`: how many transactions of ``:snapshot`` are still running.
    in_progress: str | None = None
