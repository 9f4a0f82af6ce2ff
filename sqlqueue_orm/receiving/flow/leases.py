"""Key slots leased for the session: a batched worker keeps its keys' slots between batches.

A batch that claims its keys' slots in its transaction gives them back at its commit and claims
them again in the next batch: with a hundred keys a batch, a hundred locks taken and released
per batch, on every worker, while nothing else wants them. A lease is the same slot claimed
for the session instead (the dialect's ``lease``): a worker keeps the slots of the keys its
batches keep bringing, and claims only keys new to it. Never more than the limit: a lease is a
slot like any other, so a key's leases and transaction claims together are at most
``key_concurrency``; a leased key whose messages are not in the worker's batch only holds a
slot it does not use, which restricts. A lease is given back

* at the next receive whose batch does not have its key (the batch that had it committed or
  rolled back before that receive ran);
* when a claim was refused, by this worker or another of the process (they take the careful
  path for a while, holding none);
* when the connection goes back to the pool
  (:func:`~sqlqueue_orm.connections.give_back_session_locks`, a pool ``checkin`` listener; if
  that fails, the connection is closed, and the server frees them);
* when the connection breaks or is closed: the server frees a session's locks with it.

Only on a direct connection to the server (:func:`~sqlqueue_orm.connections.direct_session`):
behind a pooler in transaction mode (PgBouncer) the next transaction may run on another server
connection, where a lease could be neither used nor given back, so leases are off there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from sqlqueue_orm import connections
from sqlqueue_orm.receiving.flow import slots

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.dialects.flow import FlowStatements
    from sqlqueue_orm.receiving.worker import WorkerState

log = logging.getLogger(__name__)


def of(
    connection: Connection, statements: FlowStatements, name: str
) -> connections.SessionLocks | None:
    """*connection*'s leases, or None where it cannot hold any (not a direct connection).

    :param name: the queue, for the log line saying leases are off.
    """
    info = connection.info
    leases: connections.SessionLocks | bool | None = info.get(connections.SESSION_LOCKS)
    if leases is None:
        assert statements.backend is not None and statements.unlease is not None
        direct = connections.direct_session(connection, statements.backend)
        if not direct:
            log.info(
                "queue %s: the session's server process is not the one the driver "
                "connected to (a pooler?): key slots are claimed per transaction",
                name,
            )
        if direct:
            unlease = slots.rendered(statements.unlease, connection)
            leases = connections.SessionLocks(unlease.text, unlease.params)
        else:
            leases = False
        info[connections.SESSION_LOCKS] = leases
    return leases if isinstance(leases, connections.SessionLocks) else None


def lease(
    worker: WorkerState,
    connection: Connection,
    statements: FlowStatements,
    held: dict[str, int],
    prefix: str,
    limit: int,
    keys: Collection[str],
) -> bool:
    """Lease a slot of each of *keys* (after *prefix*) into *held*; whether all came.

    On an error the connection is closed: which were taken is not known, and closing frees
    them all.
    """
    assert statements.lease is not None
    values = {
        "prefix": prefix,
        "k": limit,
        "first": slots.first_slot(worker, limit),
        "names": json.dumps(list(keys)),
    }
    try:
        rows = slots.rows(connection, statements.lease, values)
        refused = False
        for name, slot in rows:
            if slot is None:
                refused = True
            else:
                held[name] = slot
    except BaseException:
        connection.invalidate()
        raise
    return not refused


def give_back(
    connection: Connection,
    statements: FlowStatements,
    leases: connections.SessionLocks,
    prefix: str,
    keys: Collection[str] | None,
) -> None:
    """Give back the leases of *keys* (None: all) after *prefix* on *connection*.

    On an error the connection is closed: which were given back is not known, and closing
    frees them all.
    """
    held = leases.held.get(prefix)
    if not held:
        return
    assert statements.unlease is not None
    names = list(held) if keys is None else keys
    values = connections.SessionLocks.values(prefix, [(key, held[key]) for key in names])
    try:
        slots.rows(connection, statements.unlease, values)
        for key in names:
            del held[key]
    except BaseException:
        connection.invalidate()
        raise
