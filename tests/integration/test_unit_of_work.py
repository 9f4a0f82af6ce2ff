"""UnitOfWork: the user's rows, queue rows and outbox rows commit together or not at all."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions
from sqlqueue_orm.sending.outbox import Outbox
from sqlqueue_orm.sending.outbox_records import deserialize_operations
from sqlqueue_orm.sending.routing import Routing
from sqlqueue_orm.session import Outcome, UnitOfWork, unit_of_work
from testsupport.outbox_app import Order, count, install, outbox_rows, queue_message_ids


class Boom(Exception):
    pass


@pytest.fixture
def app(database):
    transport = database.transport()
    install(transport, "billing", "shipping")
    return transport


@pytest.mark.parametrize("mode", ["direct", "outbox"])
def test_an_exception_leaves_no_user_queue_or_outbox_rows(database, app, mode):
    with pytest.raises(Boom):
        with UnitOfWork(app, mode=mode) as uow:
            uow.session.add(Order(customer="ann", total=10))
            uow.session.flush()  # the row is written in the transaction...
            uow.send("billing", OutgoingMessage(b"invoice"))
            uow.send_many("shipping", [OutgoingMessage(b"a"), OutgoingMessage(b"b")])
            uow.session.add(Order(customer="bob", total=20))  # ...and this one pending
            raise Boom
    assert count(database.engine, Order) == 0
    assert count(database.engine, "billing") == 0
    assert count(database.engine, "shipping") == 0
    assert outbox_rows(database.engine) == []
    assert not uow.committed


def test_an_exception_with_an_incoming_message_stores_no_record(database, app):
    with pytest.raises(Boom):
        with UnitOfWork(app, incoming_message_id="incoming-1") as uow:
            uow.send("billing", OutgoingMessage(b"x"))
            raise Boom
    assert outbox_rows(database.engine) == []
    # so the retry runs the handler again
    with UnitOfWork(app, incoming_message_id="incoming-1") as uow:
        assert uow.outcome is Outcome.RUN
        uow.send("billing", OutgoingMessage(b"x"))
    assert count(database.engine, "billing") == 1


def test_a_failing_flush_rolls_back_the_sends(database, app):
    with pytest.raises(sa.exc.IntegrityError):
        with UnitOfWork(app) as uow:
            uow.send("billing", OutgoingMessage(b"x"))
            uow.session.add(Order(customer=None, total=1))  # NOT NULL: fails at the flush
    assert count(database.engine, "billing") == 0
    assert count(database.engine, Order) == 0


@pytest.mark.parametrize("mode", ["direct", "outbox"])
def test_a_committed_unit_leaves_its_rows_and_one_message_per_send(database, app, mode):
    with UnitOfWork(app, mode=mode) as uow:
        order = Order(customer="ann", total=10)
        uow.session.add(order)  # never flushed by the user: the unit flushes it
        first = uow.send("billing", OutgoingMessage(b"invoice", headers={"k": "v"}))
        more = uow.send_many("shipping", [OutgoingMessage(b"a"), OutgoingMessage(b"b")])
    assert uow.committed
    assert order.id is not None and order.customer == "ann"  # still readable after the unit
    assert count(database.engine, Order) == 1
    assert queue_message_ids(database.engine, "billing") == [first]
    assert queue_message_ids(database.engine, "shipping") == more
    assert uow.sent == {"billing": 1, "shipping": 2}
    [message] = app.receive("billing")
    assert (message.body, message.headers["k"]) == (b"invoice", "v")
    rows = outbox_rows(database.engine)
    if mode == "direct":
        assert rows == [] and uow.record_id is None
    else:
        assert rows == [(uow.record_id, True, "[]")]  # dispatched inline, Operations emptied


def test_send_mode_can_be_chosen_per_send(database, app):
    with UnitOfWork(app, mode="outbox", dispatch_inline=False) as uow:
        uow.send("billing", OutgoingMessage(b"direct"), mode="direct")
        uow.send("shipping", OutgoingMessage(b"via outbox"))
    assert count(database.engine, "billing") == 1
    assert count(database.engine, "shipping") == 0  # stored, left to the dispatcher
    [(_, dispatched, operations)] = outbox_rows(database.engine)
    assert not dispatched
    assert [operation.destination for operation in deserialize_operations(operations)] == [
        "shipping"
    ]


def test_core_statements_on_the_connection_join_the_transaction(database, app):
    table = Order.__table__
    with pytest.raises(Boom):
        with UnitOfWork(app) as uow:
            uow.connection.execute(sa.insert(table).values(customer="core", total=1))
            uow.send("billing", OutgoingMessage(b"x"))
            raise Boom
    assert count(database.engine, Order) == 0
    with UnitOfWork(app) as uow:
        uow.connection.execute(sa.insert(table).values(customer="core", total=1))
    assert count(database.engine, Order) == 1


def test_decorator_passes_the_unit_and_commits_or_rolls_back(database, app):
    @unit_of_work(app)
    def place(uow, customer, total):
        uow.session.add(Order(customer=customer, total=total))
        uow.send("billing", OutgoingMessage(customer))
        if total < 0:
            raise Boom
        return f"placed {customer}"

    assert place("ann", 10) == "placed ann"
    with pytest.raises(Boom):
        place("bob", -1)
    assert count(database.engine, Order) == 1
    assert count(database.engine, "billing") == 1


def test_decorator_skips_a_message_handled_before(database, app):
    calls = []

    @unit_of_work(app, mode="outbox", incoming_message_id=lambda message_id: message_id)
    def handle(uow, message_id):
        calls.append(message_id)
        uow.session.add(Order(customer=message_id, total=1))
        uow.send("billing", OutgoingMessage(message_id))
        return "handled"

    assert handle("m-1") == "handled"
    assert handle("m-1") is None
    assert calls == ["m-1"]
    assert count(database.engine, Order) == 1
    assert count(database.engine, "billing") == 1


def test_remote_destinations_go_through_the_outbox(database, app, tmp_path):
    remote_url = f"sqlite:///{tmp_path / 'remote.db'}"
    with Outbox(app, Routing({"ledger": remote_url})) as outbox:
        remote = outbox.router.transport_for("ledger")
        remote.create_queue("ledger")
        with UnitOfWork(app, outbox=outbox) as uow:  # mode "direct", but ledger is elsewhere
            uow.session.add(Order(customer="ann", total=10))
            message_id = uow.send("ledger", OutgoingMessage(b"entry"))
            uow.send("billing", OutgoingMessage(b"local"))
        assert queue_message_ids(remote.engine, "ledger") == [message_id]
    assert count(database.engine, "billing") == 1
    [(record_id, dispatched, _)] = outbox_rows(database.engine)
    assert dispatched and record_id == uow.record_id


def test_a_failed_inline_dispatch_is_logged_and_left_for_the_dispatcher(database, app, caplog):
    outbox = Outbox(app)
    with caplog.at_level(logging.WARNING, logger="sqlqueue_orm.session"):
        with UnitOfWork(app, mode="outbox", outbox=outbox) as uow:
            uow.session.add(Order(customer="ann", total=10))
            uow.send("invoices", OutgoingMessage(b"x"))  # no such queue yet
    assert uow.committed and count(database.engine, Order) == 1
    [record] = [r for r in caplog.records if r.name == "sqlqueue_orm.session"]
    assert "invoices" in record.getMessage() and uow.record_id in record.getMessage()
    [(_, dispatched, _)] = outbox_rows(database.engine)
    assert not dispatched
    app.create_queue("invoices")
    report = outbox.dispatch_due(batch_size=10, grace_period=0)
    assert (report.dispatched, dict(report.messages)) == (1, {"invoices": 1})
    assert count(database.engine, "invoices") == 1


def test_after_commit_runs_after_the_commit_before_the_inline_dispatch(database, app):
    seen = []

    def after(uow):
        seen.append((count(database.engine, Order), count(database.engine, "billing")))

    with UnitOfWork(app, mode="outbox", after_commit=after) as uow:
        uow.session.add(Order(customer="ann", total=10))
        uow.send("billing", OutgoingMessage(b"x"))
    assert seen == [(1, 0)]
    assert count(database.engine, "billing") == 1


def test_bad_use_is_refused_by_name(database, app):
    with pytest.raises(exceptions.ConfigurationError, match="'sideways'"):
        UnitOfWork(app, mode="sideways")
    with pytest.raises(exceptions.ConfigurationError, match="must be a string of 1 to 200"):
        UnitOfWork(app, incoming_message_id="x" * 201)
    uow = UnitOfWork(app)
    with pytest.raises(exceptions.SqlQueueError, match="not open"):
        uow.send("billing", OutgoingMessage(b"x"))
    with uow:
        with pytest.raises(exceptions.ConfigurationError, match="'upward'"):
            uow.send("billing", OutgoingMessage(b"x"), mode="upward")
    with pytest.raises(exceptions.SqlQueueError, match="used once"):
        with uow:
            pass


def test_an_engine_works_as_well_as_a_transport(database, app):
    with UnitOfWork(database.engine) as uow:
        uow.session.add(Order(customer="ann", total=1))
        uow.send("billing", OutgoingMessage(b"x"))
    assert count(database.engine, "billing") == 1


def test_a_missing_outbox_table_is_named(database):
    transport = database.transport()
    transport.create_queue("billing")
    with pytest.raises(exceptions.SchemaOutdated, match="OutboxData"):
        with UnitOfWork(transport, mode="outbox") as uow:
            uow.send("billing", OutgoingMessage(b"x"))
    assert count(database.engine, "billing") == 0
