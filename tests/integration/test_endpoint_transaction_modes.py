"""Each transaction mode: a handler writes a user row and sends a message, then raises or not.

What must remain and what must vanish follows the guarantee of each mode (docs/endpoint.md):

======================  =========  ===========  ==========  ==============
mode (handler raises)   user row   sent (out)   error queue  input queue
======================  =========  ===========  ==========  ==============
NONE                    gone       1 per try    1            empty
RECEIVE_ONLY            gone       1 per try    1            empty
SENDS_ATOMIC_...        gone       0            1            empty
TRANSACTION_SCOPE       gone       0            1            empty
OUTBOX                  gone       0            1            empty
======================  =========  ===========  ==========  ==============

Succeeding leaves exactly one user row and one sent message in every mode.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, db, dialects, exceptions, headers
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.sending.outbox import Outbox
from tests.conftest import only
from tests.endpoint_app import Handled, Job, Note, UserBase, handled_ids
from testsupport.outbox_app import count, outbox_rows

RETRIES = 2
#: Handler runs of a failing message: the first try and the immediate retries (NONE: one).
TRIES = {mode: 1 if mode is TransactionMode.NONE else 1 + RETRIES for mode in TransactionMode}
REFUSED_ON_SQLITE = (TransactionMode.RECEIVE_ONLY, TransactionMode.OUTBOX)


class Boom(Exception):
    pass


def run_until(endpoint: Endpoint, done, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Run *endpoint* until ``done()`` is true (or fail after *timeout* seconds)."""
    endpoint.start()
    try:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out: {endpoint.stats}"
            time.sleep(0.02)
    finally:
        assert endpoint.stop(10)


def make_endpoint(database, tmp_path, mode: TransactionMode):  # type: ignore[no-untyped-def]
    transport = database.transport()
    user_engine = database.engine
    if database.dialect == "sqlite" and mode is TransactionMode.SENDS_ATOMIC_WITH_RECEIVE:
        # SQLite has one writer: the session's data lives in a file of its own (see strategies)
        user_engine = db.create_engine(f"sqlite:///{tmp_path / 'user.db'}")
    UserBase.metadata.create_all(user_engine)
    settings = EndpointSettings(
        concurrency=2, transaction_mode=mode, peek_delay=0.1, immediate_retries=RETRIES,
        delayed_retries=0,
    )
    endpoint = Endpoint("orders", transport, settings=settings, user_database=user_engine)
    transport.create_queue("out")
    if mode is TransactionMode.OUTBOX:
        Outbox(transport).create_table()

    @endpoint.handle(Job, type_name="Sales.Messages.Job")
    def handle(job: Job, context: HandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id))
        context.send("out", Note(number=job.number))
        if job.fail:
            raise Boom(f"job {job.number} failed")

    return endpoint, transport, user_engine


@pytest.mark.parametrize("mode", list(TransactionMode), ids=lambda mode: mode.name)
@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "raises"])
def test_what_remains_after_a_handler(database, tmp_path, mode, fail):
    if database.dialect == "sqlite" and mode in REFUSED_ON_SQLITE:
        pytest.skip("refused on SQLite (one writer); see test_sqlite_refuses_...")
    endpoint, transport, user_engine = make_endpoint(database, tmp_path, mode)
    transport.create_queue("orders")
    sent = transport.send(
        "orders",
        OutgoingMessage(
            Job(number=7, fail=fail),
            headers={headers.ENCLOSED_MESSAGE_TYPES: "Sales.Messages.Job, Sales.Messages"},
        ),
    )
    run_until(endpoint, lambda: endpoint.stats.handled + endpoint.stats.failed == 1)
    engine = database.engine
    assert count(engine, "orders") == 0
    if not fail:
        assert handled_ids(user_engine) == [sent]
        assert count(engine, "out") == 1
        assert count(engine, "error") == 0
        if mode is TransactionMode.OUTBOX:
            # the record stays (dispatched) for de-duplication; its messages left
            assert [row[:2] for row in outbox_rows(engine)] == [(sent, True)]
        return
    assert handled_ids(user_engine) == []
    ghosts = TRIES[mode] if mode in (TransactionMode.NONE, TransactionMode.RECEIVE_ONLY) else 0
    assert count(engine, "out") == ghosts
    [failed] = transport.receive("error")
    assert failed.message_id == sent
    assert failed.headers[headers.EXCEPTION_MESSAGE] == "job 7 failed"
    assert failed.headers[headers.FAILED_QUEUE] == transport.address_text("orders")
    assert endpoint.stats.retried == TRIES[mode] - 1
    if mode is TransactionMode.OUTBOX:
        assert outbox_rows(engine) == []


@only("sqlite")
@pytest.mark.parametrize("mode", REFUSED_ON_SQLITE, ids=lambda mode: mode.name)
def test_sqlite_refuses_modes_needing_a_second_writer(database, tmp_path, mode):
    endpoint, _, _ = make_endpoint(database, tmp_path, mode)
    with pytest.raises(exceptions.ConfigurationError, match="TRANSACTION_SCOPE"):
        endpoint.start()


def test_transaction_scope_refuses_user_data_elsewhere(database, tmp_path):
    other = db.create_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    endpoint = Endpoint("orders", database.transport(), user_database=other)
    with pytest.raises(exceptions.ConfigurationError, match="OUTBOX"):
        endpoint.start()


def test_outgoing_messages_carry_the_conversation_headers(database):
    transport = database.transport()
    endpoint = Endpoint("sales", transport, peek_delay=0.1)

    @endpoint.handle(Job, type_name="Sales.Messages.Job")
    def handle(job: Job, context: HandlerContext) -> None:
        context.send("billing", Note(number=job.number))
        context.reply(Job(number=job.number + 1))

    transport.create_queue("sales")
    transport.create_queue("billing")
    transport.create_queue("client")
    incoming = transport.send(
        "sales",
        OutgoingMessage(
            Job(number=1),
            headers={
                headers.ENCLOSED_MESSAGE_TYPES: "Sales.Messages.Job, Sales.Messages, Version=1.0",
                headers.REPLY_TO_ADDRESS: transport.address_text("client"),
                headers.CONVERSATION_ID: "conversation-1",
            },
        ),
    )
    run_until(endpoint, lambda: endpoint.stats.handled == 1)
    [sent] = transport.receive("billing")
    [reply] = transport.receive("client")
    for message, intent in ((sent, "Send"), (reply, "Reply")):
        assert message.headers[headers.CONVERSATION_ID] == "conversation-1"
        assert message.headers["NServiceBus.RelatedTo"] == incoming
        assert message.headers[headers.ORIGINATING_ENDPOINT] == "sales"
        assert message.headers[headers.MESSAGE_INTENT] == intent
        assert message.headers[headers.REPLY_TO_ADDRESS] == transport.address_text("sales")
    assert reply.headers[headers.CORRELATION_ID] == incoming
    # the reply is a registered model: it carries the .NET type name it was registered with
    assert reply.headers[headers.ENCLOSED_MESSAGE_TYPES] == "Sales.Messages.Job"
    assert reply.model(Job).number == 2


def test_several_handlers_of_a_type_run_in_order_in_one_transaction(database):
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    # one worker: the test reads the calls in queue order (two workers may finish 2 before 1)
    endpoint = Endpoint(
        "orders", transport, peek_delay=0.1, immediate_retries=0, delayed_retries=0,
        concurrency=1,
    )
    calls: list[str] = []

    @endpoint.handle(Job)
    def first(job: Job, context: HandlerContext) -> None:
        calls.append(f"first {job.number}")
        context.session.add(Handled(message_id=f"first {job.number}"))

    @endpoint.handle(Job)
    def second(job: Job, context: HandlerContext) -> None:
        calls.append(f"second {job.number}")
        if job.fail:
            raise Boom

    @endpoint.handle_raw
    def raw(body: bytes, context: HandlerContext) -> None:
        calls.append(f"raw {len(body)}")

    transport.create_queue("orders")
    transport.send("orders", OutgoingMessage(Job(number=1, fail=True)))
    transport.send("orders", OutgoingMessage(Job(number=2)))
    run_until(endpoint, lambda: endpoint.stats.handled + endpoint.stats.failed == 2)
    assert calls[:2] == ["first 1", "second 1"]  # the raw handler never ran for the failure
    assert calls[2:4] == ["first 2", "second 2"] and calls[4].startswith("raw ")
    assert handled_ids(database.engine) == ["first 2"]  # the first handler's row rolled back


def test_send_and_reply_leave_the_callers_message_unchanged(database):
    transport = database.transport()
    endpoint = Endpoint("sales", transport, peek_delay=0.1)
    shared = OutgoingMessage(b"same object, sent twice")
    seen: list[dict[str, str | None]] = []

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        context.send("billing", shared)
        context.reply(shared)
        seen.append(dict(shared.headers))

    transport.create_queue("billing")
    transport.create_queue("client")
    endpoint.start()
    try:
        endpoint_client = Endpoint("client", transport)
        endpoint_client.send("sales", Job(number=1))
        deadline = time.monotonic() + 20
        while endpoint.stats.handled < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        endpoint.stop()
    assert seen == [{}]
    [sent] = transport.receive("billing")
    [reply] = transport.receive("client")
    assert sent.headers[headers.MESSAGE_INTENT] == "Send"  # not the reply's intent, or vice versa
    assert reply.headers[headers.MESSAGE_INTENT] == "Reply"


class _Receipt:
    """The pump's side of one receive (the ``Receipt`` protocol), recording what it is told."""

    def __init__(self) -> None:
        self.found: list[bool] = []

    def received(self, found: bool) -> None:
        self.found.append(found)

    def connect(self, engine, keep=True):  # type: ignore[no-untyped-def]
        return engine.connect()

    def begin(self, connection):  # type: ignore[no-untyped-def]
        return connection.begin()

    def commit(self, transaction) -> None:  # type: ignore[no-untyped-def]
        transaction.commit()

    def outcome(self, name: str, count: int = 1) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "batch"),
    [(TransactionMode.TRANSACTION_SCOPE, 1), (TransactionMode.TRANSACTION_SCOPE, 10),
     (TransactionMode.NONE, 1)],
    ids=["unbatched", "batched", "none"],
)
def test_a_receive_that_finds_nothing_commits_not_rolls_back(database, mode, batch):
    """An empty receive's transaction changed nothing: it commits. A rollback would make
    psycopg drop the connection's prepared statements (and send DEALLOCATE ALL)."""
    import sqlalchemy as sa

    from sqlqueue_orm.receiving.worker import WorkerState

    transport = database.transport()
    transport.create_queue("empty_receive")
    endpoint = Endpoint(
        "empty_receive", transport, transaction_mode=mode, batch_size=batch, batch_flush=0.01,
        delayed_delivery=False,
    )
    endpoint.handle_raw(lambda body, context: None)
    mode_of = endpoint._mode_for(None)
    mode_of.prepare()
    ended: list[str] = []
    sa.event.listen(transport.engine, "rollback", lambda connection: ended.append("rollback"))
    sa.event.listen(transport.engine, "commit", lambda connection: ended.append("commit"))
    receipt = _Receipt()
    worker = WorkerState()
    for _ in range(3):
        mode_of.process(receipt, worker)
    assert receipt.found == [False, False, False]
    assert ended == ["commit"] * 3


def _none_endpoint(database, seen: list[int], fail: bool):  # type: ignore[no-untyped-def]
    """A NONE endpoint whose handler reads, writes (flushed) and sends, in that order."""
    transport = database.transport()
    UserBase.metadata.create_all(database.engine)
    endpoint = Endpoint(
        "orders", transport, transaction_mode=TransactionMode.NONE, peek_delay=0.1,
        concurrency=2,
    )
    transport.create_queue("orders")
    transport.create_queue("out")

    @endpoint.handle(Job, type_name="Sales.Messages.Job")
    def handle(job: Job, context: HandlerContext) -> None:
        seen.append(context.session.scalar(sa.select(sa.func.count()).select_from(Handled)))
        context.session.add(Handled(message_id=context.message_id))
        context.session.flush()  # the session holds its transaction (SQLite: the write lock)
        context.send("out", Note(number=job.number))
        if job.fail:
            raise Boom(f"job {job.number} failed")

    sent = transport.send(
        "orders",
        OutgoingMessage(Job(number=3, fail=fail),
                        headers={headers.ENCLOSED_MESSAGE_TYPES: "Sales.Messages.Job"}),
    )
    return endpoint, transport, sent


def test_none_handler_that_reads_writes_and_sends_is_handled_once(database):
    seen: list[int] = []
    endpoint, transport, sent = _none_endpoint(database, seen, fail=False)
    # well under SQLite's busy timeout: a send waiting for the session's own lock fails this
    run_until(endpoint, lambda: endpoint.stats.handled + endpoint.stats.failed == 1, timeout=15)
    assert (endpoint.stats.handled, endpoint.stats.failed) == (1, 0)
    assert seen == [0]
    assert handled_ids(database.engine) == [sent]
    [note] = transport.receive("out")
    assert note.model(Note).number == 3
    assert count(database.engine, "error") == 0
    assert count(database.engine, "orders") == 0


def test_none_handler_failing_after_its_session_wrote_and_it_sent(database):
    seen: list[int] = []
    endpoint, transport, sent = _none_endpoint(database, seen, fail=True)
    run_until(endpoint, lambda: endpoint.stats.failed == 1, timeout=15)
    assert handled_ids(database.engine) == []
    [failed] = transport.receive("error")
    assert failed.message_id == sent
    # One writer (SQLite): the send went out in the session's transaction, which held the
    # only write lock, and rolled back with it. Elsewhere sends leave at once.
    single_writer = dialects.for_dialect(database.engine).single_writer
    assert count(database.engine, "out") == (0 if single_writer else 1)


@only("postgresql")
@pytest.mark.parametrize("batch", [1, 5], ids=["unbatched", "batched"])
def test_each_receive_of_a_worker_is_a_transaction_of_its_own_and_none_stays_open(
    database, postgres_admin, batch
):
    """The worker keeps SQLAlchemy's transaction object between receives, not a transaction."""
    transport = database.transport()
    settings = EndpointSettings(
        concurrency=1, transaction_mode=TransactionMode.TRANSACTION_SCOPE, peek_delay=0.1,
        batch_size=batch,
    )
    endpoint = Endpoint("orders", transport, settings=settings, user_database=database.engine)
    transaction_ids: list[int] = []

    @endpoint.handle(Job, type_name="Sales.Messages.Job")
    def handle(job: Job, context: HandlerContext) -> None:
        transaction_ids.append(context.session.execute(sa.text("SELECT txid_current()")).scalar())

    transport.create_queue("orders")
    transport.send_many("orders", [OutgoingMessage(Job(number=number)) for number in range(20)])
    endpoint.start()
    try:
        deadline = time.monotonic() + 30
        while len(transaction_ids) < 20:
            assert time.monotonic() < deadline, endpoint.stats
            time.sleep(0.02)
        time.sleep(0.2)  # the last receive commits; the worker keeps its connection, idle
        with postgres_admin.connect() as admin:
            states = admin.execute(
                sa.text("SELECT state FROM pg_stat_activity WHERE datname = :name"),
                {"name": database.engine.url.database},
            ).scalars().all()
    finally:
        assert endpoint.stop(10)
    assert "idle in transaction" not in states, states
    # one transaction per receive: per message, or per batch (a batch may take fewer)
    assert len(set(transaction_ids)) >= 20 // batch
    if batch == 1:
        assert len(set(transaction_ids)) == 20
    assert transport.receive("orders", 5) == []
