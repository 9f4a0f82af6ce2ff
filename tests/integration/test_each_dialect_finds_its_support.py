"""Each database finds its own support; one error translator, the messages users see unchanged.

Each dialect's statements, locks, hints, limits and error markers live in sqlqueue_orm/dialects
(that no other module branches on a dialect's name is proven without a database, in
``tests/unit/test_no_dialect_branch_outside_dialect_modules.py``); driver errors go through one
translator (``db.wrap_db_errors``).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sqlqueue_orm import db, dialects, exceptions
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.sending.outbox import Outbox
from tests.conftest import only


def test_each_database_finds_its_own_support(database):
    support = dialects.for_dialect(database.engine)
    assert support.name == database.dialect
    with database.engine.connect() as connection:
        assert dialects.for_dialect(connection) is support
        assert dialects.for_dialect(connection.dialect) is support
    assert dialects.for_dialect(database.dialect) is support
    assert support.hot_path is sql.for_dialect(database.engine.dialect)


def test_an_unknown_dialect_keeps_the_generic_rules():
    support = dialects.for_dialect("firebird")
    assert (support.identifier_limit, support.identifier_unit) == (128, "characters")
    assert not support.cross_catalog and support.install_lock is None and support.begin == ""
    with pytest.raises(exceptions.InvalidQueueName, match="129 characters; firebird allows 128"):
        QueueAddress("q" * 129).check_for("firebird")


def test_the_postgresql_limit_is_bytes_everywhere():
    name = "é" * 32  # 64 bytes, 32 characters
    with pytest.raises(exceptions.InvalidQueueName, match="64 bytes; postgresql allows 63"):
        QueueAddress(name).check_for("postgresql")
    QueueAddress(name).check_for("mssql")


@only("postgresql")
def test_the_install_lock_holds_until_the_transaction_ends(database):
    address = QueueAddress("orders", "sales")
    support = dialects.for_dialect(database.engine)
    other = database.engine.connect()
    probe = sa.text("SELECT pg_try_advisory_xact_lock(hashtextextended(:resource, 0))")
    resource = {"resource": f"sqlqueue_orm:create:{address}"}
    try:
        with database.engine.begin() as connection:
            support.take_install_lock(connection, address)
            assert other.execute(probe, resource).scalar() is False
            other.rollback()
        assert other.execute(probe, resource).scalar() is True
    finally:
        other.close()


def test_a_missing_outbox_table_is_schema_outdated_word_for_word(database):
    outbox = Outbox(database.transport())
    with pytest.raises(exceptions.SchemaOutdated) as raised:
        outbox.dispatch_due()
    assert str(raised.value) == (
        "table 'OutboxData' is outdated: it does not exist (Outbox.create_table() creates it "
        "too); run `sqlqueue migrate`"
    )
    assert isinstance(raised.value.__cause__, sa.exc.DBAPIError)


def test_other_outbox_errors_say_outbox_and_the_driver_error(database):
    with database.engine.begin() as connection:
        connection.execute(sa.text('CREATE TABLE "OutboxData" ("MessageId" VARCHAR(200))'))
    outbox = Outbox(database.transport())
    with pytest.raises(exceptions.DatabaseError) as raised:
        outbox.dispatch_due()
    assert not isinstance(raised.value, exceptions.SchemaOutdated)
    cause = raised.value.__cause__
    assert isinstance(cause, sa.exc.DBAPIError)
    assert str(raised.value) == f"outbox: {type(cause.orig).__name__}: {cause.orig}"
    assert raised.value.transient == db.is_transient(cause)


def test_a_missing_queue_table_is_queue_not_found(database):
    with database.engine.connect() as connection, pytest.raises(exceptions.QueueNotFound):
        with db.wrap_db_errors("absent"):
            connection.execute(sa.text('SELECT 1 FROM "absent"'))
