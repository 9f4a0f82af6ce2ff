"""Batched processing: one transaction receives up to N messages, one SAVEPOINT per handler.

A failing handler rolls back its SAVEPOINT only; its retries and its move to the error queue
happen in the batch's transaction, and no other message of the batch notices. A crash (SIGKILL)
re-delivers at most the uncommitted batch: nothing is lost, and in TRANSACTION_SCOPE (the
handler's rows roll back with the batch) and OUTBOX (de-duplicated on the message id) nothing
is handled twice.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, exceptions
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from sqlqueue_orm.sending.outbox import Outbox
from tests import batch_app
from tests.conftest import only
from tests.endpoint_app import Handled, Job, UserBase, handled_ids
from tests.integration.test_endpoint_transaction_modes import run_until
from testsupport.outbox_app import REPO, count

BATCH = 10
RETRIES = 1


class Boom(Exception):
    pass


def _modes(database):  # type: ignore[no-untyped-def]
    # OUTBOX writes its unit of work on a second connection: refused on SQLite (one writer)
    if database.dialect == "sqlite":
        return [TransactionMode.TRANSACTION_SCOPE]
    return [TransactionMode.TRANSACTION_SCOPE, TransactionMode.OUTBOX]


def _one_worker_scope(queue: str, transport, batch: int, immediate_retries: int) -> Endpoint:  # type: ignore[no-untyped-def]
    """A TRANSACTION_SCOPE endpoint on one worker, *batch* messages a transaction, no delayed
    retries (a message that fails its immediate retries goes to the error queue)."""
    return Endpoint(
        queue,
        transport,
        concurrency=1,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1,
        batch_size=batch,
        batch_flush=0.05,
        immediate_retries=immediate_retries,
        delayed_retries=0,
    )


def test_settings_bound_the_batch():
    assert EndpointSettings().batch_size == 1
    with pytest.raises(exceptions.ConfigurationError, match=r"batch_flush 0\.1"):
        EndpointSettings(batch_flush=0.1)
    with pytest.raises(exceptions.ConfigurationError, match="batch_size 0"):
        EndpointSettings(batch_size=0)


@pytest.mark.parametrize(
    "mode",
    [
        TransactionMode.NONE,
        TransactionMode.RECEIVE_ONLY,
        TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
    ],
    ids=lambda mode: mode.name,
)
def test_modes_that_cannot_keep_a_batch_are_refused(database, mode):
    endpoint = Endpoint(
        "refused", database.transport(), transaction_mode=mode, batch_size=5, peek_delay=0.1
    )
    endpoint.handle(Job, lambda job, context: None)
    with pytest.raises(exceptions.ConfigurationError, match=f"cannot run in {mode.name}"):
        endpoint.start()
    endpoint.stop(1)


def test_a_failing_handler_affects_no_other_message_of_its_batch(database):
    for mode in _modes(database):
        _every_seventh_fails(database, mode)


def _every_seventh_fails(database, mode: TransactionMode) -> None:  # type: ignore[no-untyped-def]
    transport = database.transport()
    engine = transport.engine
    queue = f"seventh_{mode.value}"
    UserBase.metadata.drop_all(engine)
    UserBase.metadata.create_all(engine)
    for name in (queue, "out", "error"):
        transport.create_queue(name)
        transport.purge_all(name)
    if mode is TransactionMode.OUTBOX:
        Outbox(transport).create_table()
    settings = EndpointSettings(
        concurrency=2,
        transaction_mode=mode,
        peek_delay=0.1,
        batch_size=BATCH,
        batch_flush=0.05,
        immediate_retries=RETRIES,
        delayed_retries=0,
    )
    endpoint = Endpoint(queue, transport, settings=settings)
    runs: collections.Counter[int] = collections.Counter()
    transactions: dict[str, int] = {}

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        runs[job.number] += 1
        context.session.add(Handled(message_id=context.message_id))
        context.send("out", OutgoingMessage(f"from {job.number}"))
        if database.dialect == "postgresql" and mode is TransactionMode.TRANSACTION_SCOPE:
            # the session shares the batch's transaction: messages of one batch share its id
            transactions[context.message_id] = context.session.execute(
                sa.text("SELECT txid_current()")
            ).scalar_one()
        if job.number % 7 == 0:
            raise Boom(f"job {job.number} fails")

    total = 40
    sent = transport.send_many(queue, [OutgoingMessage(Job(number=n)) for n in range(1, total + 1)])
    failing = [message_id for number, message_id in enumerate(sent, 1) if number % 7 == 0]
    run_until(
        endpoint, timeout=60.0, done=lambda: endpoint.stats.handled + endpoint.stats.failed == total
    )

    assert sorted(handled_ids(engine)) == sorted(set(sent) - set(failing))  # each once
    assert count(engine, queue) == 0
    assert count(engine, "out") == total - len(failing)  # the failing ones' sends rolled back
    errors = transport.receive("error", len(failing) + 1)
    assert sorted(message.message_id for message in errors) == sorted(failing)
    assert all(runs[number] == 1 + RETRIES for number in range(7, total + 1, 7))
    assert all(runs[number] == 1 for number in range(1, total + 1) if number % 7)
    stats = endpoint.stats
    assert (stats.handled, stats.failed, stats.retried) == (
        total - len(failing),
        len(failing),
        len(failing) * RETRIES,
    )
    if transactions:
        # batches happened: far fewer transactions than messages
        assert len(set(transactions.values())) < total / 2


def test_a_retried_messages_failures_are_forgotten_once_its_batch_commits(database):
    """A message that failed once and was handled on its immediate retry leaves nothing
    remembered once its batch commits (the failure counts are bounded, not a leak)."""
    transport = database.transport()
    transport.create_queue("forgotten")
    transport.create_queue("error")
    endpoint = _one_worker_scope("forgotten", transport, batch=5, immediate_retries=2)
    runs: collections.Counter[int] = collections.Counter()

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        runs[job.number] += 1
        if job.number == 3 and runs[job.number] == 1:
            raise Boom("once")

    transport.send_many("forgotten", [OutgoingMessage(Job(number=n)) for n in range(5)])
    run_until(endpoint, timeout=60.0, done=lambda: endpoint.stats.handled == 5)
    assert runs[3] == 2 and endpoint.stats.retried == 1, (runs, endpoint.stats)
    assert endpoint._pumps()[0].mode.failures.size == 0


@only("postgresql")
@pytest.mark.parametrize("batch", [1, 5], ids=["unbatched", "batched"])
def test_a_failed_move_to_the_error_queue_keeps_the_attempts_counted(database, batch):
    """The commit that moves a message to the error queue fails (a deferred trigger on the
    error queue, once): the message comes back with its attempts still counted, so it goes to
    the error queue after one more failure, not after a second round of immediate retries."""
    transport = database.transport()
    transport.create_queue("counted")
    transport.create_queue("error")
    error_table = transport.engine.dialect.identifier_preparer.quote(
        transport.queues.address("error").table
    )
    with transport.engine.begin() as connection:
        connection.exec_driver_sql("CREATE SEQUENCE first_move")
        connection.exec_driver_sql(
            "CREATE FUNCTION fail_first_move() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF nextval('first_move') = 1 THEN RAISE EXCEPTION 'the first move fails'; END IF; "
            "RETURN NULL; END $$"
        )
        connection.exec_driver_sql(
            f"CREATE CONSTRAINT TRIGGER fail_first_move AFTER INSERT ON {error_table} "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_first_move()"
        )
    endpoint = Endpoint(
        "counted", transport, concurrency=1, transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1, batch_size=batch, batch_flush=0.05, immediate_retries=2,
        delayed_retries=0, initial_backoff=0.01,  # the failed commit: the receive's breaker
    )
    runs: collections.Counter[int] = collections.Counter()

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        runs[job.number] += 1
        if job.number == 2:
            raise Boom("always")

    transport.send_many("counted", [OutgoingMessage(Job(number=n)) for n in range(4)])
    run_until(endpoint, timeout=60.0, done=lambda: count(transport.engine, "error") == 1 and count(
        transport.engine, "counted") == 0)
    # 1 + 2 immediate retries, the move's commit fails; back, attempt 4 fails: moved
    assert runs[2] == 4, runs
    assert endpoint._pumps()[0].mode.failures.size == 0


def _start(
    url: str, mode: TransactionMode | None, kill_at: int, batch: int = BATCH
) -> subprocess.Popen[str]:
    """``tests.batch_app`` in a process of its own; *mode* ``None``: the default mode."""
    chosen = "default" if mode is None else mode.value
    return subprocess.Popen(
        [sys.executable, "-m", "tests.batch_app", url, chosen, str(batch), str(kill_at)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_mid_batch_loses_nothing_and_repeats_nothing(database):
    for mode in _modes(database):
        _killed_mid_batch(database, mode)


def test_sigkill_mid_handler_unbatched_in_the_default_mode_handles_each_message_once(database):
    """One message a transaction, the mode left unset: TRANSACTION_SCOPE, where the handler's
    session writes commit with the receive. Killed three times in the middle of a handler (its
    row flushed, not committed; two workers, so another may be in flight), then run to the end:
    each message's row is committed exactly once, and none is lost."""
    assert EndpointSettings().transaction_mode is TransactionMode.TRANSACTION_SCOPE
    _killed_mid_batch(database, None, batch=1)


def _killed_mid_batch(database, mode: TransactionMode | None, batch: int = BATCH) -> None:  # type: ignore[no-untyped-def]
    """Kill ``tests.batch_app`` at its 25th, 37th and 16th handler runs, then drain the queue
    in this process: each message handled once, none lost."""
    transport = database.transport()
    engine = transport.engine
    UserBase.metadata.drop_all(engine)
    UserBase.metadata.create_all(engine)
    transport.create_queue(batch_app.QUEUE)
    transport.purge_all(batch_app.QUEUE)
    if mode is TransactionMode.OUTBOX:
        Outbox(transport).create_table()
    total = 120
    sent = transport.send_many(
        batch_app.QUEUE, [OutgoingMessage(Job(number=n)) for n in range(total)]
    )
    # Each run dies at its K-th handler run: in the middle of a batch (K is not a multiple of
    # the batch size), after the batch's earlier messages ran their handlers.
    for kill_at in (25, 37, 16):
        process = _start(database.url, mode, kill_at, batch)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == -9, stderr  # killed, not finished
    assert count(engine, batch_app.QUEUE) < total  # the runs committed batches before dying
    endpoint = batch_app.build(transport, mode, batch)
    run_until(endpoint, timeout=60.0, done=lambda: count(engine, batch_app.QUEUE) == 0)
    handled = handled_ids(engine)
    assert sorted(set(handled)) == sorted(sent)  # nothing lost
    assert len(handled) == len(sent)  # nothing handled twice


@pytest.mark.parametrize("batch", [BATCH, 1], ids=["batched", "unbatched"])
def test_a_savepoint_opens_only_for_handlers_that_reach_the_database(database, batch):
    """Empty handlers cost no SAVEPOINT; a send, a defer, a session still get theirs first.

    The proof that each handler's writes sit under its own SAVEPOINT: a handler that defers
    and then fails leaves no deferred row behind (its retry leaves the one row), and a session
    write survives only for the handlers that succeed. Unbatched the same holds: one message
    per transaction, its SAVEPOINT opened the same way.
    """
    transport = database.transport()
    engine = transport.engine
    queue = f"lazy_savepoint_{batch}"
    UserBase.metadata.drop_all(engine)
    UserBase.metadata.create_all(engine)
    for name in (queue, "out", "error"):
        transport.create_queue(name)
    transport.create_delayed_table(queue)
    endpoint = _one_worker_scope(queue, transport, batch, immediate_retries=1)
    runs: collections.Counter[int] = collections.Counter()

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        runs[job.number] += 1
        kind = job.number % 4
        if kind == 1:
            context.send("out", OutgoingMessage(f"from {job.number}"))
        elif kind == 2:
            context.defer(OutgoingMessage(f"later {job.number}"), delay=3_600)
            if runs[job.number] == 1:
                raise Boom(f"job {job.number} fails once, after its defer")
        elif kind == 3:
            context.session.add(Handled(message_id=context.message_id))
            context.session.flush()  # the row is in the batch's transaction
            if runs[job.number] == 1:
                raise Boom(f"job {job.number} fails once, after its session write")
        # kind 0: touches nothing

    savepoints: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SAVEPOINT") and " worker " in (
            threading.current_thread().name
        ):
            savepoints.append(statement)

    total = 40
    sent = transport.send_many(queue, [OutgoingMessage(Job(number=n)) for n in range(total)])
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        run_until(endpoint, timeout=60.0, done=lambda: endpoint.stats.handled == total)
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)

    kinds = collections.Counter(number % 4 for number in range(total))
    assert count(engine, "out") == kinds[1]
    assert _delayed_rows(transport, queue) == kinds[2]  # the failed runs' defers rolled back
    session_writers = [sent[number] for number in range(total) if number % 4 == 3]
    assert sorted(handled_ids(engine)) == sorted(session_writers)  # each once
    assert endpoint.stats.retried == kinds[2] + kinds[3]
    assert count(engine, queue) == 0
    # one SAVEPOINT per send; two per defer and per session (the failed run and its retry),
    # the session's own SAVEPOINT inside ours; none for the handlers that touch nothing
    assert len(savepoints) == kinds[1] + 2 * kinds[2] + 2 * 2 * kinds[3]


def _delayed_rows(transport, endpoint: str) -> int:  # type: ignore[no-untyped-def]
    from sqlqueue_orm.queuing import sql

    address = transport.queues.delayed_table(endpoint).address
    table = sql.format_table(transport.engine.dialect, address)
    with transport.engine.connect() as connection:
        return int(connection.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar_one())


@pytest.mark.parametrize("batch", [BATCH, 1], ids=["batched", "unbatched"])
def test_a_failed_handlers_sends_are_rolled_back_and_wake_nobody(database, batch):
    """A handler that sends and then fails: its send rolls back with its SAVEPOINT, and the
    wake-up after the commit names only the queues of the sends that stayed (the others of
    the batch, which share one list of destinations with it)."""
    transport = database.transport()
    queue = f"sends_roll_back_{batch}"
    for name in (queue, "kept", "ghost", "error"):
        transport.create_queue(name)
    endpoint = _one_worker_scope(queue, transport, batch, immediate_retries=0)

    @endpoint.handle(Job)
    def handle(job: Job, context: HandlerContext) -> None:
        if job.number % 3 == 0:
            context.send("ghost", OutgoingMessage(f"never {job.number}"))
            raise Boom(f"job {job.number} fails after its send")
        context.send("kept", OutgoingMessage(f"from {job.number}"))

    woken: list[str] = []
    transport.sent_hooks.append(lambda address: woken.append(address.table))
    total = 30
    transport.send_many(queue, [OutgoingMessage(Job(number=n)) for n in range(total)])
    woken.clear()  # the sends above announce the input queue
    run_until(
        endpoint, timeout=60.0, done=lambda: endpoint.stats.handled + endpoint.stats.failed == total
    )

    failing = len(range(0, total, 3))
    assert (endpoint.stats.handled, endpoint.stats.failed) == (total - failing, failing)
    assert count(transport.engine, "kept") == total - failing
    assert count(transport.engine, "ghost") == 0
    assert count(transport.engine, "error") == failing
    assert "kept" in woken
    assert "ghost" not in woken
