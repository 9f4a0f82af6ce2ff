"""What one worker thread carries from one receive to the next.

The pump makes one :class:`WorkerState` per worker thread and hands it to every receive that
thread runs (:meth:`~sqlqueue_orm.receiving.modes.base.ReceiveMode.process`), which passes it
on to the receiver (:mod:`sqlqueue_orm.receiving.flow`). Nothing here is shared between
threads, so it needs no lock; its fields are slots, read and written as plain attributes on
the hot path.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlqueue_orm import addressing
    from sqlqueue_orm.receiving.scope import MessageScope

#: Numbers the workers of this process in the order they were made.
_numbers = itertools.count()


class WorkerState:
    """One worker's state between receives (see the module docstring)."""

    __slots__ = (
        "allowance",
        "busy",
        "folding",
        "forwarded",
        "fresh",
        "held_keys",
        "last_keys",
        "number",
        "scope",
    )

    def __init__(self) -> None:
        #: This worker's place among the process's workers: the slot it tries first
        #: (:func:`sqlqueue_orm.receiving.flow.slots.first_slot`).
        self.number = next(_numbers)
        #: Messages this receive may take (a batch's rate-limit tokens), or None: no limit.
        self.allowance: int | None = None
        #: Whether the receive's transaction holds nothing yet (no row, no slot): only its
        #: first receive may roll it back or take the global slot with the rows.
        self.fresh = True
        #: Per-key limit, batched: whether this worker claims its keys' slots per transaction
        #: for now instead of leasing them (its batches keep bringing keys new to it), and
        #: the keys of its last batch (to tell when they settle again).
        self.folding = False
        self.last_keys: set[str] | None = None
        #: Per-key limit within one process (SQLite): the keys this receive counted, given
        #: back when it ends; and whether every waiting key was at its limit (then the worker
        #: backs off before its next receive).
        self.held_keys: list[str] = []
        self.busy = False
        #: The message scope of the message being handled (its sends join it), or None.
        self.scope: MessageScope | None = None
        #: Where a matured delayed message this receive took was forwarded, or None.
        self.forwarded: addressing.QueueAddress | None = None
