"""The ``sqlqueue`` Spark data source on real databases and a real ``local[2]`` Spark.

* a stream from a queue into Parquet, SIGKILLed mid-batch and between a batch's commit and its
  delete, restarted from its checkpoint while messages keep arriving: every message exactly
  once in the output, none left in the queue;
* a writer holding its transaction open (its RowVersion/seq taken, a later one committed) is
  waited for, not skipped;
* a streaming sink SIGKILLed mid-batch and restarted sends each row once;
* ``spark.read.format("sqlqueue")`` leaves the queue unchanged, with the same typed columns as
  the DataFrame parser.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import headers
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.models.queue_table import queue_table
from tests.conftest import only

pytest.importorskip("pyspark")

from sqlqueue_orm.contrib.spark import dataset, sample
from tests.integration.spark_support import REPO

# Spark's session starts with the first test; the killed streams restart their queries.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

def queue_count(engine, name):
    table = queue_table(name, dialect=engine)
    with engine.connect() as connection:
        return connection.execute(sa.select(sa.func.count()).select_from(table)).scalar()


def message(number):
    return OutgoingMessage(
        body=f"body {number}".encode(),
        headers={headers.ENCLOSED_MESSAGE_TYPES: "Sales.OrderPlaced, Sales",
                 headers.TIME_SENT: headers.format_time(dt.datetime.now(dt.UTC))},
        message_id=str(uuid.uuid5(uuid.NAMESPACE_OID, str(number))),
    )


def child_environment():
    environment = dict(os.environ)
    environment["PYTHONPATH"] = REPO + os.pathsep + environment.get("PYTHONPATH", "")
    return environment


def start_child(script, *arguments, log_path):
    """A Spark driver process; its log goes to a file (a full pipe would stall it)."""
    log = open(log_path, "w")  # closed by kill_child
    child = subprocess.Popen(
        [sys.executable, "-c", script, *arguments],
        env=child_environment(), stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    child.log = log
    child.log_path = log_path
    return child


def kill_child(child, ready, what):
    """SIGKILL *child* once *ready()*; fail with its log if it ended before."""
    try:
        wait_for(lambda: ready() or child.poll() is not None, what)
        if child.poll() is not None:
            with open(child.log_path) as log:
                pytest.fail(f"the child ended before {what}: {log.read()[-3000:]}")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.log.close()


def wait_for(condition, what, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def batch_files(checkpoint, kind):
    directory = os.path.join(checkpoint, kind)
    if not os.path.isdir(directory):
        return set()
    return {int(name) for name in os.listdir(directory) if name.isdigit()}


# -- a stream into Parquet, killed and restarted --------------------------------------------------
STREAM_TO_PARQUET = textwrap.dedent(
    """
    import sys
    from sqlqueue_orm.contrib.spark import session, streaming
    url, output, checkpoint = sys.argv[1:4]
    spark = session.spark_session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    streaming.register(spark)
    query = (
        spark.readStream.format("sqlqueue").option("url", url).option("queue", "audit")
        .option("maxRowsPerBatch", "100").option("partitions", "3").load()
        .writeStream.format("parquet").option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds").start(output)
    )
    query.awaitTermination()
    """
)


class Feeder(threading.Thread):
    """Sends numbered messages to the audit queue, a few at a time, until stopped."""

    def __init__(self, transport, first, last):
        super().__init__(daemon=True)
        self.transport = transport
        self.next = first
        self.last = last
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set() and self.next < self.last:
            self.transport.send_many("audit", [message(self.next + i) for i in range(10)])
            self.next += 10
            time.sleep(0.2)

    def stop(self):
        self.halt.set()
        self.join()
        return self.next


def test_stream_killed_and_restarted_from_its_checkpoint_delivers_each_message_once(
    spark, database, tmp_path
):
    transport = database.transport()
    transport.create_queue("audit")
    transport.send_many("audit", [message(i) for i in range(300)])
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    feeder = Feeder(transport, 300, 900)
    feeder.start()

    def run_until(kill_when, what):
        child = start_child(STREAM_TO_PARQUET, database.url, output, checkpoint,
                            log_path=tmp_path / "child.log")
        kill_child(child, kill_when, what)

    try:
        # 1. mid-batch: a batch planned (its offsets logged) but not committed. Its replay
        # reads the same rows whatever the database: proved where writers run concurrently
        # (each killed run starts its own JVM).
        if database.dialect != "sqlite":
            run_until(lambda: len(batch_files(checkpoint, "commits")) >= 1
                      and batch_files(checkpoint, "offsets") - batch_files(checkpoint, "commits"),
                      "a batch in flight")
        # 2. just after a batch's commit, before the next latestOffset deletes its rows
        done = batch_files(checkpoint, "commits")
        run_until(lambda: len(batch_files(checkpoint, "commits") - done) >= 2,
                  "two more committed batches")
    finally:
        sent = feeder.stop()

    # The rest in this process, from the same checkpoint, until the queue is drained.
    query = (
        spark.readStream.format("sqlqueue").option("url", database.url).option("queue", "audit")
        .option("maxRowsPerBatch", "500").load()
        .writeStream.format("parquet").option("checkpointLocation", checkpoint).start(output)
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    rows = spark.read.parquet(output).select("message_id", "body", "row_version").collect()
    expected = {message(i).message_id: i for i in range(sent)}
    got = [row["message_id"] for row in rows]
    assert len(got) == len(set(got)), "a message was written twice"
    assert set(got) == set(expected), "a message was lost"
    assert all(row["body"] == f"body {expected[row['message_id']]}".encode() for row in rows)
    assert queue_count(database.engine, "audit") == 0


# -- a writer holding its transaction open ---------------------------------------------------------
def test_a_writer_holding_its_transaction_open_is_waited_for_not_skipped(spark, database):
    transport = database.transport()
    transport.create_queue("audit")
    query = (
        spark.readStream.format("sqlqueue").option("url", database.url).option("queue", "audit")
        .load().writeStream.format("memory").queryName(f"held_{database.dialect}").start()
    )

    def seen():
        query.processAllAvailable()
        return sorted(row["message_id"] for row in spark.table(f"held_{database.dialect}")
                      .select("message_id").collect())

    try:
        holder = database.engine.connect()
        transaction = holder.begin()
        transport.send("audit", message(1), connection=holder)  # takes RowVersion/seq 1, open
        if database.dialect == "sqlite":
            # SQLite serialises writers (BEGIN IMMEDIATE): nobody can commit a later one, and
            # the source waits for the lock; the holder commits a moment later.
            timer = threading.Timer(1.0, lambda: (transaction.commit(), holder.close()))
            timer.start()
        else:
            transport.send("audit", message(2))  # takes 2 and commits before 1
            assert seen() == []  # 2 alone would move the offset past 1: 1 would be lost
            transaction.commit()
            holder.close()
        wanted = sorted(message(i).message_id for i in ((1, 2) if database.dialect != "sqlite"
                                                        else (1,)))
        wait_for(lambda: seen() == wanted, "the held message")
        transport.send("audit", message(3))
        wait_for(lambda: seen() == sorted([*wanted, message(3).message_id]), "a later message")
    finally:
        query.stop()
    # The committed batches left the queue (the last one at the next latestOffset or restart).
    assert queue_count(database.engine, "audit") <= 1


# -- the sink, killed mid-batch --------------------------------------------------------------------
STREAM_TO_QUEUE = textwrap.dedent(
    """
    import sys
    from sqlqueue_orm.contrib.spark import session, streaming
    url, source, checkpoint = sys.argv[1:4]
    spark = session.spark_session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    streaming.register(spark)
    query = (
        spark.readStream.schema("order_id long, customer string").json(source)
        .repartition(2)
        .writeStream.format("sqlqueue").option("url", url).option("queue", "billing")
        .option("headerColumns", '{"Sales.Customer": "customer"}').option("batchSize", "20")
        .option("checkpointLocation", checkpoint).start()
    )
    query.awaitTermination()
    """
)


def test_streaming_sink_killed_mid_batch_and_restarted_sends_each_row_once(
    spark, database, tmp_path
):
    transport = database.transport()
    transport.create_queue("billing")
    source, checkpoint = tmp_path / "orders", str(tmp_path / "checkpoint")
    source.mkdir()
    total = 3_000
    with open(source / "orders.json", "w") as out:
        for i in range(total):
            out.write(json.dumps({"order_id": i, "customer": f"c{i % 7}"}) + "\n")

    child = start_child(STREAM_TO_QUEUE, database.url, str(source), checkpoint,
                        log_path=tmp_path / "child.log")
    # Killed once some rows of the (only) batch are sent and before all are.
    kill_child(child, lambda: queue_count(database.engine, "billing") >= 100, "the first sends")
    partial = queue_count(database.engine, "billing")
    assert 0 < partial < total, partial

    # Restarted from the checkpoint: Spark replays the batch; the ledger skips what was sent.
    query = (
        spark.readStream.schema("order_id long, customer string").json(str(source))
        .repartition(2)
        .writeStream.format("sqlqueue").option("url", database.url).option("queue", "billing")
        .option("headerColumns", '{"Sales.Customer": "customer"}').option("batchSize", "20")
        .option("checkpointLocation", checkpoint).start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    table = queue_table("billing", dialect=database.engine)
    with database.engine.connect() as connection:
        rows = connection.execute(sa.select(table.c.Headers, table.c.Body)).all()
    orders = [json.loads(bytes(body))["order_id"] for _, body in rows]
    assert sorted(orders) == list(range(total))  # each row once
    customers = {json.loads(bytes(body))["order_id"]: headers.deserialize(raw)["Sales.Customer"]
                 for raw, body in rows}
    assert all(customers[i] == f"c{i % 7}" for i in range(total))


# -- the batch read ------------------------------------------------------------------------------
def test_batch_read_leaves_the_queue_unchanged_with_the_parsers_columns(
    spark, database, tmp_path
):
    transport = database.transport()
    audit, _ = sample.fill_sample_queues(
        transport, count=300, failure_rate=0.0, seed=5, start=dt.datetime(2024, 5, 6, 23, 50)
    )
    table = queue_table("audit", dialect=database.engine)
    with database.engine.connect() as connection:
        before = connection.execute(
            sa.select(table.c.Id, table.c.RowVersion, table.c.Headers, table.c.Body)
        ).all()

    frame = (
        spark.read.format("sqlqueue").option("url", database.url).option("queue", "audit")
        .option("partitions", "3").load()
    )
    assert frame.rdd.getNumPartitions() == 3
    rows = frame.collect()
    assert sorted(row["message_id"] for row in rows) == sorted(m.message_id for m in audit)
    with database.engine.connect() as connection:
        after = connection.execute(
            sa.select(table.c.Id, table.c.RowVersion, table.c.Headers, table.c.Body)
        ).all()
    assert sorted(after) == sorted(before)

    # The same typed columns as the DataFrame parser gives the same rows.
    raw = spark.createDataFrame(
        [(str(i), int(v), h, bytes(b) if b is not None else None) for i, v, h, b in before],
        dataset.QUEUE_ROW_SCHEMA,
    )
    ingested_at = dt.datetime(2024, 5, 7, tzinfo=dt.UTC)
    parsed = {row["native_id"]: row.asDict() for row in
              dataset.parse_messages(raw, "audit", ingested_at).collect()}
    for row in rows:
        ours = row.asDict()
        theirs = parsed[ours["native_id"]]
        for name in dataset.DATASET_SCHEMA.fieldNames():
            if name != "ingested_at":
                assert ours[name] == theirs[name], name
    assert {row["date"] for row in rows} == {dt.date(2024, 5, 6), dt.date(2024, 5, 7)}


# -- ingest --follow ---------------------------------------------------------------------------
FOLLOW = textwrap.dedent(
    """
    import sys
    from sqlqueue_orm import cli
    sys.exit(cli.main(sys.argv[1:]))
    """
)


@only("sqlite")
def test_ingest_follow_streams_until_sigterm(spark, database, tmp_path):
    transport = database.transport()
    transport.create_queue("audit")
    transport.send_many("audit", [message(i) for i in range(50)])
    path = str(tmp_path / "messages")
    child = start_child(FOLLOW, "--url", database.url, "spark", "ingest", "--queue", "audit",
                        "--path", path, "--follow", "--trigger", "0.5", "--master", "local[2]",
                        log_path=tmp_path / "child.log")
    counted = {}  # the dataset's data files -> its row count

    def landed():
        # Counted with Spark only when the files changed: a Spark job per poll would take the
        # cores the child needs.
        if not os.path.isdir(path) or not any(n.startswith("date=") for n in os.listdir(path)):
            return 0
        files = frozenset(
            os.path.join(root, name)
            for root, _, names in os.walk(path)
            if not os.path.relpath(root, path).startswith("_sqlqueue")
            for name in names
            if name.endswith(".parquet")
        )
        if files not in counted:
            counted.clear()
            counted[files] = dataset.read_dataset(spark, path).count()
        return counted[files]

    try:
        wait_for(lambda: landed() == 50 or child.poll() is not None, "the first messages")
        transport.send_many("audit", [message(i) for i in range(50, 80)])  # while it runs
        wait_for(lambda: landed() == 80 or child.poll() is not None, "the later messages")
        assert child.poll() is None, open(child.log_path).read()[-3000:]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 0, open(child.log_path).read()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.log.close()
    output = open(child.log_path).read()
    assert "audit: ingested 80 message(s)" in output, output[-3000:]
    assert re.search(r"queue audit: batch \d+: \d+ message\(s\), \d+ msg/s in", output)
    ids = [row["message_id"] for row in dataset.read_dataset(spark, path).collect()]
    assert sorted(ids) == sorted(message(i).message_id for i in range(80))
    assert queue_count(database.engine, "audit") == 0


# -- trigger(availableNow=True) ----------------------------------------------------------------
def test_available_now_reads_in_batches_and_leaves_nothing_it_read_in_the_queue(
    spark, database, tmp_path
):
    transport = database.transport()
    transport.create_queue("audit")
    transport.send_many("audit", [message(i) for i in range(25)])
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_available_now():
        query = (
            spark.readStream.format("sqlqueue").option("url", database.url)
            .option("queue", "audit").option("maxRowsPerBatch", "10").load()
            .writeStream.format("parquet").option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start(output)
        )
        assert query.awaitTermination(300), "the availableNow query did not end"
        assert query.exception() is None

    run_available_now()
    assert len(batch_files(checkpoint, "commits")) == 3  # maxRowsPerBatch holds: 10, 10, 5
    assert queue_count(database.engine, "audit") == 0  # the last batch too
    transport.send_many("audit", [message(i) for i in range(25, 30)])
    run_available_now()  # the next run reads only what came since
    assert queue_count(database.engine, "audit") == 0
    got = [row["message_id"] for row in spark.read.parquet(output).select("message_id").collect()]
    assert sorted(got) == sorted(message(i).message_id for i in range(30))  # each once
