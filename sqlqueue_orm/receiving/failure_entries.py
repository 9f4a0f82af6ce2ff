"""The failure-group entry of each message an endpoint moves to its error queue.

An endpoint writes the entry (:mod:`sqlqueue_orm.models.failure_group`) of a failed message or
poison row in the transaction that moves it, so listing the groups never fingerprints our own
failures: only rows others write (.NET endpoints, other tools) are grouped when listed.

The table is made (or looked for) when the endpoint starts, with its queues, never while a
message fails. The entry is only a cache of what the headers say, so it never stands in the
move's way: it is written only when the table is known to exist, in a savepoint of its own, and
any error writing it rolls back that savepoint alone; the move commits without it, and the next
listing of the groups writes it. (A savepoint rather than the bare insert: a failed statement
aborts the whole transaction on PostgreSQL; rather than a transaction of its own: the entry and
the message then commit together, so no listing ever sees one without the other.)
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from sqlqueue_orm import exceptions
from sqlqueue_orm.models import failure_group, failure_keys

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from sqlqueue_orm.messages import PreparedMessage
    from sqlqueue_orm.transport import Transport

log = logging.getLogger(__name__)


def prepare(transport: Transport, error_queue: str, *, create: bool) -> None:
    """At the endpoint's start: create the table (*create*) or look for it.

    A failure is logged, naming the error queue, and the endpoint starts anyway: its moves
    then write no entries, and listings group those messages as they group others'.
    """
    try:
        if create:
            failure_keys.ensure_table(transport.engine)
        else:
            failure_keys.find_table(transport.engine)
    except exceptions.SqlQueueError as error:
        log.warning(
            "queue %s: failure groups table %s not available (%s); listings will group "
            "this endpoint's failures",
            error_queue,
            failure_group.TABLE_NAME,
            error,
        )


def writer(
    transport: Transport,
    error_queue: str,
    row: PreparedMessage,
    found: Mapping[str, str | None] | None,
) -> Callable[[Connection], None] | None:
    """What writes the entry of *row*, moved to *error_queue*, in the move's connection.

    :param found: the row's headers (None: a poison row, its headers unreadable).
    :returns: None when no entry is to be written (the table not known to exist, an address
        too long for the table, or a poison row whose stored Id is not a UUID, which no entry
        can name).
    """
    if not isinstance(row.id, uuid.UUID) or not failure_keys.table_known(transport.engine):
        return None
    queue = str(transport.queues.address(error_queue))
    if len(queue) > failure_group.QUEUE_LENGTH:
        return None
    try:
        values = failure_keys.entry(queue, row.id, row.message_id, found)
    except Exception:  # a bug in the keys must not stop the move: the listing tries again
        log.exception("queue %s: no failure group entry for message %s", error_queue, row.id)
        return None

    def write(connection: Connection) -> None:
        if not failure_keys.insert_one(connection, values):
            log.debug("queue %s: no failure group entry for message %s", error_queue, row.id)

    return write
