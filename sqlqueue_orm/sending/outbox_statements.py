"""Every statement on ``OutboxData`` and ``OutboxDelivery`` the outbox runs, and its errors.

Store, read, claim, mark, defer and clean up; the per-dialect parts come from
:mod:`sqlqueue_orm.dialects`: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``WITH (UPDLOCK,
READPAST, ROWLOCK)`` on SQL Server (whose SQLAlchemy dialect drops ``with_for_update()``
silently), and nothing on SQLite, where ``BEGIN IMMEDIATE`` (set up by
:func:`sqlqueue_orm.db.create_engine`) already serializes writers.
"""

from __future__ import annotations

import contextlib
from typing import Any

import sqlalchemy as sa

from sqlqueue_orm import db, dialects
from sqlqueue_orm.models import outbox_delivery
from sqlqueue_orm.models.outbox import TABLE_NAME, outbox_table


def claim_statement(
    *, by_id: bool = False, limit: int = 1, skipping: bool = False
) -> sa.Select[Any]:
    """SELECT that locks undispatched records no one else holds (the claim, every dialect).

    ``by_id``: the record ``:message_id`` (inline dispatch, re-dispatch); otherwise up to
    *limit* records whose ``DispatchedAt`` is before ``:cutoff``, oldest first, and with
    *skipping* none of the records ``:skipped`` (a list) names.
    """
    table = outbox_table()
    statement = sa.select(table.c.MessageId, table.c.Operations).where(
        table.c.Dispatched == sa.false()
    )
    if by_id:
        statement = statement.where(table.c.MessageId == sa.bindparam("message_id"))
    else:
        statement = (
            statement.where(table.c.DispatchedAt < sa.bindparam("cutoff", type_=sa.DateTime()))
            .order_by(table.c.DispatchedAt)
            .limit(limit)
        )
        if skipping:
            statement = statement.where(
                table.c.MessageId.not_in(sa.bindparam("skipped", expanding=True))
            )
    statement = statement.with_for_update(skip_locked=True)
    for support in dialects.ALL.values():
        if support.claim_hint is not None:
            statement = statement.with_hint(table, support.claim_hint, dialect_name=support.name)
    return statement


def mark_dispatched_statement() -> sa.Update:
    """UPDATE marking ``:message_id`` dispatched at ``:now`` and emptying its Operations."""
    table = outbox_table()
    return (
        sa.update(table)
        .where(table.c.MessageId == sa.bindparam("message_id"))
        .values(
            Dispatched=sa.true(),
            DispatchedAt=sa.bindparam("now", type_=sa.DateTime()),
            Operations="[]",
        )
    )


def defer_statement() -> sa.Update:
    """UPDATE moving the undispatched ``:message_id`` to ``:until`` (after a failed dispatch)."""
    table = outbox_table()
    return (
        sa.update(table)
        .where(table.c.MessageId == sa.bindparam("message_id"), table.c.Dispatched == sa.false())
        .values(DispatchedAt=sa.bindparam("until", type_=sa.DateTime()))
    )


def cleanup_statement(dialect: sa.engine.Dialect) -> sa.Executable:
    """DELETE of up to ``:batch_size`` records dispatched before ``:cutoff``.

    SQL Server: NServiceBus's ``DELETE TOP`` with ``ROWLOCK, READPAST`` (and ``MAXDOP 1``);
    elsewhere a LIMITed sub-select (which skips locked rows on PostgreSQL).
    """
    table = outbox_table()
    return dialects.for_dialect(dialect).batched_delete(
        table,
        ("MessageId",),
        sa.and_(
            table.c.Dispatched == sa.true(),
            table.c.DispatchedAt < sa.bindparam("cutoff", type_=sa.DateTime()),
        ),
        "[Dispatched] = 1 AND [DispatchedAt] < :cutoff",
    )


def delivered_statement() -> sa.Select[Any]:
    """SELECT of the ``OutboxDelivery`` rows of ``:destination`` among the message ``:ids``."""
    table = outbox_delivery.outbox_delivery_table()
    return sa.select(table.c.MessageId, table.c.OutboxRecordId).where(
        table.c.Destination == sa.bindparam("destination"),
        table.c.MessageId.in_(sa.bindparam("ids", expanding=True)),
    )


def delivery_cleanup_statement(dialect: sa.engine.Dialect) -> sa.Executable:
    """DELETE of up to ``:batch_size`` ``OutboxDelivery`` rows delivered before ``:cutoff``.

    Batched as :func:`cleanup_statement` is: ``DELETE TOP`` on SQL Server, a LIMITed sub-select
    of the key elsewhere (skipping locked rows on PostgreSQL).
    """
    table = outbox_delivery.outbox_delivery_table()
    return dialects.for_dialect(dialect).batched_delete(
        table,
        ("Destination", "MessageId"),
        table.c.DeliveredAt < sa.bindparam("cutoff", type_=sa.DateTime()),
        "[DeliveredAt] < :cutoff",
    )


def outbox_errors() -> contextlib.AbstractContextManager[None]:
    """:func:`sqlqueue_orm.db.wrap_db_errors` for ``OutboxData``: a missing table said plainly."""
    return db.wrap_db_errors(
        label="outbox",
        missing_table=(
            TABLE_NAME,
            # SchemaOutdated adds "; run `sqlqueue migrate`": the other way, said once
            "it does not exist (Outbox.create_table() creates it too)",
        ),
    )
