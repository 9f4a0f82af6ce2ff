"""The exceptions sqlqueue_orm raises: one root, :class:`SqlQueueError`, and a few precise children.

Every exception's docstring is its default message. Driver errors are translated by one function,
:func:`sqlqueue_orm.db.translate_error` (:func:`~sqlqueue_orm.db.wrap_db_errors` is its block
form), so every public call raises this family when the database cannot be used.
"""

from __future__ import annotations


class SqlQueueError(Exception):
    """An error in sqlqueue_orm."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(SqlQueueError, ValueError):
    """A setting, a queue name or an address is not valid."""


class InvalidQueueName(ConfigurationError):
    """The queue name cannot be used on this database."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"invalid queue name {name!r}: {reason}")


class InvalidMessage(SqlQueueError, ValueError):
    """The message cannot be sent as it is."""


class QueueNotFound(SqlQueueError):
    """The queue table does not exist."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"queue table {queue!r} does not exist; create it with create_queue()")


class SchemaOutdated(SqlQueueError):
    """A table does not have the schema this version of sqlqueue_orm needs."""

    def __init__(self, table: str, missing: str) -> None:
        self.table = table
        self.missing = missing
        super().__init__(f"table {table!r} is outdated: {missing}; run `sqlqueue migrate`")


class DuplicateMessage(SqlQueueError):
    """A message with this id was already handled."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        super().__init__(f"message {message_id!r} was already handled")


class DispatchError(SqlQueueError):
    """Outgoing messages could not be dispatched."""


class DatabaseError(SqlQueueError):
    """The database failed; the operation was not carried out (its transaction rolled back)."""

    def __init__(self, message: str | None = None, *, transient: bool = False) -> None:
        self.transient = transient
        super().__init__(message)


class DatabaseLocked(DatabaseError):
    """Another connection held the database's write lock for longer than the busy timeout."""

    def __init__(
        self, file: str | None = None, waited: float | None = None, where: str = ""
    ) -> None:
        #: The database file, when known.
        self.file = file
        #: Seconds waited for the lock, when known.
        self.waited = waited
        what = f"database file {file}" if file else "the database"
        after = f" (waited {waited:g} s)" if waited is not None else ""
        super().__init__(
            f"{where}{what} is locked: another process (or another connection of this one) "
            f"holds its write lock{after}; try again once it has committed, or stop it "
            "(?timeout=SECONDS in the URL waits longer)",
            transient=True,
        )


class UnknownMessageType(SqlQueueError):
    """No handler of the endpoint accepts this message."""

    def __init__(self, message_id: str, message_types: str | None) -> None:
        self.message_id = message_id
        self.message_types = message_types
        super().__init__(
            f"message {message_id!r}: no handler for its type {message_types!r} "
            "(register one with Endpoint.handle, or a raw handler with Endpoint.handle_raw)"
        )
