"""A pooled connection checked out once and kept across many units of work.

A checkout per short transaction (or per receive) costs as much CPU as the transaction's own
statements, so four parts of the package keep a connection out of the pool between units of
work: the transport's per-thread DBAPI connections
(:class:`~sqlqueue_orm.connections.ThreadConnections`), the per-thread SQLAlchemy Connections
of ``transport.begin()`` (:class:`~sqlqueue_orm.transactions.KeptConnections`), the pump's
workers (:class:`~sqlqueue_orm.receiving.tasks.Worker`) and an endpoint's operations threads
(:class:`~sqlqueue_orm.ops_connection.OpsConnection`). Each holds its connection in a
:class:`KeptConnection`, which

* counts the units of work it served, so its owner gives it back after :data:`KEEP_MOST` and
  the pool's own checks (``pool_pre_ping``, ``pool_recycle``) still see it under steady load;
* gives it back to the pool once (:meth:`KeptConnection.close`), invalidated when it is dead
  (never pooled again), and tells its owner (``on_release``: a budget, the pump's count of
  connections its workers hold) after the connection is back;
* knows whether it was inherited by a forked child (:meth:`KeptConnection.inherited`), which
  must never use nor close the parent's socket (:meth:`KeptConnection.abandon`);
* gives the connection back when its owner lets go of it (a thread's ``threading.local``
  ending drops it, and ``__del__`` closes it).

When to give the connection back (a failed transaction, an invalidation, a pool with no room
for what comes next, a stop) is its owner's decision.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["KEEP_MOST", "KeptConnection", "Pooled"]

#: Most units of work one kept connection serves before it goes back to the pool, so
#: ``pool_pre_ping`` and ``pool_recycle`` still see it under steady load.
KEEP_MOST = 1_000

#: This process's id, kept current in forked children (``os.getpid()`` is a system call).
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class Pooled(Protocol):
    """A checked-out connection: a SQLAlchemy ``Connection`` or a pool's DBAPI connection."""

    def invalidate(self) -> None:
        """Discard the driver connection: the pool never hands it out again."""

    def close(self) -> None:
        """Give the connection back to the pool."""


C = TypeVar("C", bound=Pooled)


class KeptConnection(Generic[C]):
    """One checked-out connection kept across units of work (see the module docstring).

    :param connection: the connection, checked out of the pool by the owner.
    :param on_release: called once the connection is given back or abandoned (a budget's
        count, the pump's); it must not refer to this object, so that dropping the last
        reference to it gives the connection back at once.
    """

    __slots__ = ("__weakref__", "closed", "connection", "on_release", "pid", "uses")

    def __init__(self, connection: C, on_release: Callable[[], None] | None = None) -> None:
        self.connection = connection
        self.on_release = on_release
        self.pid = _pid
        #: Units of work served so far (counted by :meth:`used`).
        self.uses = 0
        #: Whether the connection was given back (or abandoned): it must not be used again.
        self.closed = False

    def used(self) -> bool:
        """Count one more unit of work; return whether it has served :data:`KEEP_MOST`."""
        self.uses += 1
        return self.uses >= KEEP_MOST

    def inherited(self) -> bool:
        """Whether this process is a forked child of the one that checked the connection out."""
        return self.pid != _pid

    def close(self, dead: bool = False) -> None:
        """Give the connection back to the pool (*dead*: invalidated first, never pooled again).

        A second call does nothing. ``on_release`` is called once the connection is back, also
        when closing it raised.
        """
        if self.closed:
            return
        self.closed = True
        try:
            if dead:
                self.connection.invalidate()
            self.connection.close()
        finally:
            self.released()

    def abandon(self) -> None:
        """Forget the connection without touching it (it belongs to another process)."""
        if not self.closed:
            self.closed = True
            self.released()

    def released(self) -> None:
        """Tell the owner the connection is no longer kept (called once, by close or abandon)."""
        if self.on_release is not None:
            self.on_release()

    def __del__(self) -> None:  # its owner let go of it (a thread ended)
        try:
            self.close()
        except Exception:  # noqa: S110  (interpreter shutdown, a dead connection: nothing to do)
            pass
