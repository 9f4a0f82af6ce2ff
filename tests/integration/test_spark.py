"""The Spark pipeline against real databases and a real local SparkSession (one per session).

* send_dataframe: 10,000 rows over 4 partitions, each delivered once with the right headers,
  and re-runs (after a partial run) that send only what is missing;
* ingest: a run SIGKILLed at chosen points (a test seam in the code, not a mock), then re-run,
  leaves each message exactly once in Parquet and none in the queue;
* report: its figures agree with figures computed here in Python from the same messages.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
import sqlalchemy as sa

from sqlqueue_orm import ConfigurationError, QueueNotFound, cli, headers
from sqlqueue_orm.models.queue_table import queue_table
from tests.conftest import only

pytest.importorskip("pyspark")

from sqlqueue_orm.contrib.spark import dataset, ingesting, locking, reporting, sample, sending
from tests.integration.spark_support import REPO

# Spark's session starts with the first test; a killed ingest starts a JVM of its own each run.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

def queue_rows(engine, name):
    table = queue_table(name, dialect=engine)
    with engine.connect() as connection:
        return connection.execute(
            sa.select(table.c.Id, table.c.RowVersion, table.c.Headers, table.c.Body)
        ).all()


def queue_count(engine, name):
    table = queue_table(name, dialect=engine)
    with engine.connect() as connection:
        return connection.execute(sa.select(sa.func.count()).select_from(table)).scalar()


# -- send_dataframe ------------------------------------------------------------------------------
def test_send_dataframe_delivers_each_row_once_and_reruns_skip_what_was_sent(spark, database):
    transport = database.transport()
    transport.create_queue("orders")
    rows = spark.range(10_000).selectExpr(
        "id",
        "concat('customer-', id % 97) AS customer",
        "named_struct('order', id, 'amount', id * 0.5) AS payload",
    ).repartition(4)
    assert rows.rdd.getNumPartitions() == 4
    options = dict(
        body_column="payload",
        key_column="id",
        headers={headers.ENCLOSED_MESSAGE_TYPES: "Sales.Messages.PlaceOrder, Sales.Messages"},
        header_columns={"Sales.Customer": "customer"},
        batch_size=700,
    )

    # A first run that got through part of the data (as a job failing midway would) ...
    partial = sending.send_dataframe(rows.where("id % 3 = 0"), "orders", database.url, **options)
    assert (partial.sent, partial.skipped) == (3334, 0)
    # ... a re-run of the whole job sends only the rest, and another re-run sends nothing.
    rerun = sending.send_dataframe(rows, "orders", database.url, **options)
    assert (rerun.sent, rerun.skipped) == (6666, 3334)
    again = sending.send_dataframe(rows, "orders", database.url, **options)
    assert (again.sent, again.skipped) == (0, 10_000)

    received = queue_rows(database.engine, "orders")
    assert len(received) == 10_000
    expected_ids = {sending.message_id_for("orders", str(i)): i for i in range(10_000)}
    seen = set()
    for _native_id, _row_version, raw_headers, body in received:
        values = headers.deserialize(raw_headers)
        message_id = values[headers.MESSAGE_ID]
        i = expected_ids[message_id]
        assert i not in seen
        seen.add(i)
        assert values["Sales.Customer"] == f"customer-{i % 97}"
        assert values[headers.ENCLOSED_MESSAGE_TYPES] == "Sales.Messages.PlaceOrder, Sales.Messages"
        assert values[headers.CONTENT_TYPE] == "application/json"
        assert values[headers.MESSAGE_INTENT] == "Send"
        assert values[headers.CORRELATION_ID] == message_id
        headers.parse_time(values[headers.TIME_SENT])
        assert json.loads(bytes(body)) == {"order": i, "amount": i * 0.5}
    assert '"application\\/json"' in received[0][2]  # the wire format's escaped slash
    assert len(seen) == 10_000
    with database.engine.connect() as connection:
        ledger = connection.exec_driver_sql('SELECT COUNT(*) FROM "SparkSendLedger"').scalar()
    assert ledger == 10_000


@only("sqlite")
def test_send_dataframe_bodies_without_key_and_bad_input(spark, database):
    transport = database.transport()
    transport.create_queue("texts")
    frame = spark.createDataFrame(
        [("a", b"\x00\x01", 1), ("b\u00e9", None, 2), (None, b"x", 3)],
        "text string, raw binary, n int",
    ).repartition(2)
    assert sending.send_dataframe(frame, "texts", database.url, body_column="text").sent == 3
    assert sending.send_dataframe(frame, "texts", database.url, body_column="raw").sent == 3
    assert sending.send_dataframe(frame, "texts", database.url).sent == 3  # whole row as JSON
    bodies = collections.Counter(
        None if body is None else bytes(body) for *_, body in queue_rows(database.engine, "texts")
    )
    assert bodies[b"a"] == bodies["b\u00e9".encode()] == bodies[b"\x00\x01"] == 1
    assert bodies[None] == 2  # a null text body and a null binary body
    assert bodies[b'{"text":"a","raw":"AAE=","n":1}'] == 1

    with pytest.raises(ConfigurationError, match="'nope'"):
        sending.send_dataframe(frame, "texts", database.url, body_column="nope")
    with pytest.raises(ConfigurationError, match="'n' is int"):
        sending.send_dataframe(frame, "texts", database.url, body_column="n")
    with pytest.raises(ConfigurationError, match="'missing'"):
        sending.send_dataframe(frame, "texts", database.url, key_column="missing")
    with pytest.raises(ConfigurationError, match="in-memory"):
        sending.send_dataframe(frame, "texts", "sqlite://")
    with pytest.raises(QueueNotFound, match="'absent'"):
        sending.send_dataframe(frame, "absent", database.url, body_column="text")


# -- ingest ------------------------------------------------------------------------------------
#: An ingest that SIGKILLs itself, as a crash would, when a batch reaches the step named in its
#: last argument (``written:2``: batch 2 written to staging), through ingesting.on_step.
KILLED_INGEST = textwrap.dedent(
    """
    import logging, os, signal, sys
    from sqlqueue_orm.contrib.spark import ingesting, session

    def die_at(step, batch):
        if f"{step}:{batch}" == sys.argv[4]:
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    ingesting.on_step = die_at
    spark = session.spark_session("local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    ingesting.ingest(spark, sys.argv[1], "audit", sys.argv[2], batch_size=int(sys.argv[3]))
    print("finished without being killed")
    """
)


def ingest_killed_at(url, path, point, batch_size):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = REPO + os.pathsep + environment.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", KILLED_INGEST, url, path, str(batch_size), point],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr[-3000:]


def listing(directory):
    """Entries of *directory*, without Hadoop's hidden checksum files."""
    return [name for name in os.listdir(directory) if not name.startswith(".")]


def dataset_keys(spark, path):
    rows = dataset.read_dataset(spark, path).select("native_id", "message_id").collect()
    return [row["native_id"] for row in rows], [row["message_id"] for row in rows]


#: Where each run is killed, and (rows in the dataset, rows in the queue, committed batches)
#: afterwards. 2,500 messages in batches of 1,000. Each killed run starts its own JVM, so each
#: kill point is proved once: dying before and after a batch's commit is Spark- and file-side
#: work, on SQLite; dying with a batch's rows in the dataset and still in the queue leaves the
#: re-run the database's part (delete them, write none twice), on the other databases.
KILL_PLANS = {
    "sqlite": [
        # after batch 2 was written to staging, before its commit: batch 1 is done
        ("written:2", 1000, 1500, 0),
        # after the commit of the next batch, before its files moved and its rows left
        ("committed:1", 1000, 1500, 1),
    ],
    # after batch 1's files moved into the dataset, before its rows left the queue
    "postgresql": [("moved:1", 1000, 2500, 1)],
}
KILL_PLANS["mssql"] = KILL_PLANS["postgresql"]


def test_ingest_killed_midway_and_rerun_leaves_each_message_once(spark, database, tmp_path):
    transport = database.transport()
    audit, _ = sample.fill_sample_queues(
        transport, count=2_500, failure_rate=0.0, seed=7, start=dt.datetime(2024, 5, 6, 23, 30)
    )
    native_ids = {str(row[0]) for row in queue_rows(database.engine, "audit")}
    path = str(tmp_path / "dataset")
    state = tmp_path / "dataset" / "_sqlqueue"

    for point, in_dataset, in_queue, committed in KILL_PLANS[database.dialect]:
        ingest_killed_at(database.url, path, point, 1000)
        assert len(dataset_keys(spark, path)[0]) == in_dataset, point
        assert queue_count(database.engine, "audit") == in_queue, point
        assert len(listing(state / "committed")) == committed, point

    # The re-run finishes the committed batch, then ingests what is left.
    result = ingesting.ingest(spark, database.url, "audit", path, batch_size=1000)
    assert result.recovered == 1
    assert result.recovered_messages + result.messages == in_queue

    natives, message_ids = dataset_keys(spark, path)
    assert sorted(natives) == sorted(native_ids)  # each exactly once
    assert sorted(message_ids) == sorted(message.message_id for message in audit)
    assert queue_count(database.engine, "audit") == 0
    assert not listing(state / "staging") and not listing(state / "committed")
    # Messages around midnight land in two date partitions.
    dates = {name for name in os.listdir(path) if name.startswith("date=")}
    assert dates == {"date=2024-05-06", "date=2024-05-07"}


def test_one_ingester_per_queue(spark, database, tmp_path):
    transport = database.transport()
    transport.create_queue("audit")
    address = transport.queues.address("audit")
    lock = locking.ingest_lock(database.engine, sa.make_url(database.url), address)
    with lock:
        with pytest.raises(ingesting.IngestInProgress, match="another ingestion"):
            ingesting.ingest(spark, database.url, "audit", str(tmp_path / "d"))
    assert ingesting.ingest(spark, database.url, "audit", str(tmp_path / "d")).messages == 0
    with pytest.raises(QueueNotFound):
        ingesting.ingest(spark, database.url, "nope", str(tmp_path / "d"))
    with pytest.raises(ConfigurationError, match="batch_size 0"):
        ingesting.ingest(spark, database.url, "audit", str(tmp_path / "d"), batch_size=0)


def lock_files(directory):
    return sorted(path.name for path in directory.iterdir() if ".ingest-" in path.name)


@only("sqlite")
def test_the_sqlite_ingest_lock_is_a_file_only_while_it_is_held(database, tmp_path):
    transport = database.transport()
    transport.create_queue("audit")
    address = transport.queues.address("audit")
    url = sa.make_url(database.url)
    first = locking.ingest_lock(database.engine, url, address)
    second = locking.ingest_lock(database.engine, url, address)
    assert isinstance(first, locking.FileLock)
    with first:
        held = lock_files(tmp_path)
        assert len(held) == 1 and held[0].startswith("queue.db.ingest-"), held
        assert not second.acquire()  # held: refused, and the holder's file stays
        assert lock_files(tmp_path) == held
    assert lock_files(tmp_path) == []
    with second:  # free again
        pass
    assert lock_files(tmp_path) == []


@only("sqlite")
def test_an_ingest_on_sqlite_leaves_no_lock_file(spark, database, tmp_path):
    transport = database.transport()
    sample.fill_sample_queues(transport, count=50, failure_rate=0.0, seed=5)
    result = ingesting.ingest(spark, database.url, "audit", str(tmp_path / "dataset"))
    assert result.messages == 50
    assert queue_count(database.engine, "audit") == 0
    assert lock_files(tmp_path) == []


# -- report ------------------------------------------------------------------------------------
def linear_percentile(values, p):
    ordered = sorted(values)
    rank = p * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def nearest_rank_percentile(values, p):
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def micros(text):
    moment = headers.parse_time(text)
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


@only("sqlite")
def test_report_agrees_with_figures_computed_from_the_messages(
    spark, database, tmp_path, capsys
):
    transport = database.transport()
    audit, error = sample.fill_sample_queues(
        transport, count=1_500, failure_rate=0.04, seed=3,
        start=dt.datetime(2024, 5, 6, 9, 0), span=dt.timedelta(minutes=30),
    )
    assert len(error) == 60
    path = str(tmp_path / "messages")
    assert ingesting.ingest(spark, database.url, "audit", path).messages == 1500
    assert ingesting.ingest(spark, database.url, "error", path).messages == 60

    # Figures computed directly from the messages sent.
    def message_type(values):
        return values[headers.ENCLOSED_MESSAGE_TYPES].split(";")[0].split(",")[0].strip()

    processing = collections.defaultdict(list)
    critical = collections.defaultdict(list)
    ended = collections.defaultdict(list)
    failed = collections.Counter()
    buckets = collections.Counter()
    failed_buckets = collections.Counter()
    by_exception = collections.Counter()
    for message in audit:
        values = message.headers
        group = (message_type(values), values[headers.PROCESSING_ENDPOINT])
        end = micros(values[headers.PROCESSING_ENDED])
        processing[group].append((end - micros(values[headers.PROCESSING_STARTED])) / 1000)
        critical[group].append((end - micros(values[headers.TIME_SENT])) / 1000)
        ended[group].append(end)
        buckets[end // 60_000_000 * 60] += 1
    for message in error:
        values = message.headers
        failed[(message_type(values), values[headers.PROCESSING_ENDPOINT])] += 1
        failed_buckets[micros(values[headers.TIME_OF_FAILURE]) // 60_000_000 * 60] += 1
        by_exception[values[headers.EXCEPTION_TYPE]] += 1

    exact = reporting.report(spark, path, bucket_seconds=60, exact=True)
    approximate = reporting.report(spark, path, bucket_seconds=60)
    assert exact.messages == 1560
    for result, percentile in ((exact, linear_percentile), (approximate, nearest_rank_percentile)):
        rows = result.summary.collect()
        assert {(r["message_type"], r["processing_endpoint"]) for r in rows} == set(processing)
        for row in rows:
            group = (row["message_type"], row["processing_endpoint"])
            assert row["processed"] == len(processing[group])
            assert row["failed"] == failed[group]
            span = max((max(ended[group]) - min(ended[group])) / 1e6, 1.0)
            assert row["per_second"] == pytest.approx(len(processing[group]) / span)
            for p in (50, 95, 99):
                assert row[f"processing_p{p}_ms"] == pytest.approx(
                    percentile(processing[group], p / 100), rel=1e-9
                ), (group, p)
                assert row[f"critical_p{p}_ms"] == pytest.approx(
                    percentile(critical[group], p / 100), rel=1e-9
                ), (group, p)
        series = result.throughput.collect()
        assert {r["bucket_epoch"]: r["processed"] for r in series if r["processed"]} == buckets
        assert {r["bucket_epoch"]: r["failed"] for r in series if r["failed"]} == failed_buckets
        assert {r["exception_type"]: r["failures"] for r in result.failures.collect()} == (
            by_exception
        )

    # Typed columns of one message, straight from its headers.
    first = audit[0]
    [row] = (
        dataset.read_dataset(spark, path)
        .where(f"message_id = '{first.message_id}'")
        .selectExpr("*", "unix_micros(time_sent) AS sent_us",
                    "unix_micros(processing_ended) AS ended_us")
        .collect()
    )
    assert row["message_type"] == message_type(first.headers)
    assert row["sending_endpoint"] == first.headers[headers.ORIGINATING_ENDPOINT]
    assert row["processing_endpoint"] == first.headers[headers.PROCESSING_ENDPOINT]
    assert row["conversation_id"] == first.headers[headers.CONVERSATION_ID]
    assert row["sent_us"] == micros(first.headers[headers.TIME_SENT])
    assert row["ended_us"] == micros(first.headers[headers.PROCESSING_ENDED])
    assert row["body"] == first.body.encode()
    assert row["queue"] == "audit" and row["date"] == dt.date(2024, 5, 6)
    [failure] = (
        dataset.read_dataset(spark, path).where(f"message_id = '{error[0].message_id}'").collect()
    )
    assert failure["exception_type"] == error[0].headers[headers.EXCEPTION_TYPE]
    assert failure["exception_message"] == error[0].headers[headers.EXCEPTION_MESSAGE]
    assert failure["failed_queue"] == error[0].headers[headers.FAILED_QUEUE]
    assert failure["processing_time_ms"] is None and failure["queue"] == "error"

    # The CLI prints the same figures and writes the chart.
    chart = tmp_path / "report.png"
    code = cli.main(["spark", "report", "--path", path, "--chart", str(chart), "--bucket", "60",
                     "--exact"])
    assert code == 0
    out = capsys.readouterr().out
    assert "1560 message(s): 1500 processed, 60 failed" in out
    top = exact.summary.first()
    assert f"{top['processing_p95_ms']:.1f}" in out
    for exception_type, count in by_exception.items():
        assert exception_type in out and f" {count} " in out
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@only("sqlite")
def test_cli_sample_send_ingest(spark, database, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="sqlqueue_orm.contrib.spark")
    url = database.url
    assert cli.main(["--url", url, "spark", "sample", "--count", "200", "--minutes", "5"]) == 0
    assert "audit: 200 audit message(s); error: 4 error message(s)" in capsys.readouterr().out
    assert cli.main(["--url", url, "spark", "ingest", "--queue", "audit", "--path",
                     str(tmp_path / "d"), "--batch", "150"]) == 0
    assert "audit: ingested 200 message(s) in 2 batch(es)" in capsys.readouterr().out
    # Progress, one line per batch, the queue named in each.
    progress = [r.getMessage() for r in caplog.records if "so far" in r.getMessage()]
    assert [line.split(" (")[0] for line in progress] == [
        "queue audit: 150 message(s) in 1 batch(es) so far",
        "queue audit: 200 message(s) in 2 batch(es) so far",
    ]
    caplog.clear()

    orders = tmp_path / "orders.csv"
    orders.write_text("order_id,customer,amount\n1001,alice,12.5\n1002,bob,7.25\n")
    database.transport().create_queue("sales")
    arguments = ["--url", url, "spark", "send", "--queue", "sales", "--input", str(orders),
                 "--key-column", "order_id", "--header-column", "Sales.Customer=customer",
                 "--header", "NServiceBus.EnclosedMessageTypes=Sales.Messages.PlaceOrder"]
    assert cli.main([*arguments, "--partitions", "2"]) == 0
    assert "sales: sent 2 message(s), skipped 0 already sent" in capsys.readouterr().out
    # Progress of the send: finished partitions and rows so far, the queue named.
    assert any(
        re.fullmatch(r"queue sales: sending: (\d+) of \1 partition\(s\) done, 2 row\(s\) so far",
                     r.getMessage())
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert cli.main(arguments) == 0
    assert "sales: sent 0 message(s), skipped 2 already sent" in capsys.readouterr().out
    bodies = [json.loads(bytes(row[3])) for row in queue_rows(database.engine, "sales")]
    assert sorted(bodies, key=lambda body: body["order_id"]) == [
        {"order_id": 1001, "customer": "alice", "amount": 12.5},
        {"order_id": 1002, "customer": "bob", "amount": 7.25},
    ]
    assert cli.main(["--url", url, "spark", "send", "--queue", "sales", "--input",
                     str(tmp_path / "none.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- inputs checked before Spark starts ---------------------------------------------------------
RUN_CLI = textwrap.dedent(
    """
    import sys
    from sqlqueue_orm import cli
    try:
        code = cli.main(sys.argv[1:])
    finally:
        context = getattr(sys.modules.get("pyspark"), "SparkContext", None)
        print("JVM started" if getattr(context, "_gateway", None) else "no JVM")
    sys.exit(code)
    """
)


def run_cli(*arguments, cwd):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = REPO + os.pathsep + environment.get("PYTHONPATH", "")
    environment.pop("SQLQUEUE_URL", None)
    return subprocess.run(
        [sys.executable, "-c", RUN_CLI, *arguments],
        env=environment, cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )


def assert_refused_before_spark(done, code, *named):
    """Exit *code*, one line on stderr naming each of *named*, and no JVM (no Spark log line)."""
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr[-3000:]
    assert len(lines) == 1, done.stderr[-3000:]
    for value in named:
        assert value in lines[0], lines[0]
    assert done.stdout.splitlines()[-1] == "no JVM"
    assert "log4j" not in done.stderr and "WARN" not in done.stderr


def test_spark_commands_refuse_bad_input_before_starting_spark(database, tmp_path):
    url = database.url
    transport = database.transport()
    transport.create_queue("sales")
    transport.create_queue("audit")
    orders = tmp_path / "orders.csv"
    orders.write_text("order_id,customer\n1,alice\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    not_a_dataset = tmp_path / "plain"
    not_a_dataset.mkdir()
    (not_a_dataset / "notes.txt").write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    # Asking the database: a queue that does not exist, on every database.
    cases = [
        # (arguments, the values the one line names)
        (["send", "--queue", "absent", "--input", str(orders)], ["'absent'"]),
        (["ingest", "--queue", "absent", "--path", str(tmp_path / "d")], ["'absent'"]),
    ]
    if database.dialect == "sqlite":
        # Files and arguments only: the same checks whatever the database, so on one (each
        # case is a process of its own).
        cases += [
            (["send", "--queue", "sales", "--input", str(tmp_path / "none.csv")], ["none.csv"]),
            (["send", "--queue", "sales", "--input", str(orders), "--key-column", "nope"],
             ["'nope'"]),
            (["send", "--queue", "sales", "--input", str(orders), "--header-column",
              "Sales.Customer=client"], ["'client'"]),
            (["send", "--queue", "sales", "--input", str(a_file)], ["a-file", "--format"]),
            (["ingest", "--queue", "audit", "--path", str(tmp_path / "d"), "--batch",
              "1000001"], ["1000001"]),
            (["ingest", "--queue", "audit", "--path", str(a_file)], ["a-file"]),
            (["report", "--path", str(tmp_path / "nowhere")], ["nowhere"]),
            (["report", "--path", str(not_a_dataset)], ["notes.txt"]),
            (["report", "--path", str(empty), "--chart", str(tmp_path / "no" / "c.png")],
             [str(tmp_path / "no")]),
        ]
    for arguments, named in cases:
        done = run_cli("--url", url, "spark", *arguments, cwd=tmp_path)
        assert_refused_before_spark(done, 2, *named)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql+psycopg://someone:secret@127.0.0.1:1/nowhere", ["127.0.0.1:1", "refused"]),
        ("sqlite:////nonexistent-directory/queues.db", ["/nonexistent-directory/queues.db",
                                                        "unable to open"]),
    ],
)
def test_spark_commands_report_an_unreachable_database_in_one_line(url, named, tmp_path):
    orders = tmp_path / "orders.csv"
    orders.write_text("order_id\n1\n")
    for arguments in (
        ["send", "--queue", "sales", "--input", str(orders)],
        ["ingest", "--queue", "audit", "--path", str(tmp_path / "d")],
        ["sample", "--count", "10"],
    ):
        done = run_cli("--url", url, "spark", *arguments, cwd=tmp_path)
        assert_refused_before_spark(done, 1, *named)
        assert "secret" not in done.stderr


# -- no Spark needed ----------------------------------------------------------------------------
def test_package_imports_pyspark_lazily_and_says_what_to_install():
    code = textwrap.dedent(
        """
        import sys
        import sqlqueue_orm.contrib.spark as spark
        import sqlqueue_orm.cli.spark, sqlqueue_orm.contrib.spark.sample
        from sqlqueue_orm import cli
        cli.build_parser()
        assert "pyspark" not in sys.modules, "pyspark imported eagerly"
        sys.modules["pyspark"] = None  # as if it were not installed
        try:
            spark.ingest
        except Exception as error:
            print(type(error).__name__, error)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO)
    assert done.stdout.startswith("ConfigurationError")
    assert "install sqlqueue_orm[spark]" in done.stdout


def test_message_ids_are_deterministic_per_destination_and_key():
    assert sending.message_id_for("orders", "1") == sending.message_id_for("orders", "1")
    assert sending.message_id_for("orders", "1") != sending.message_id_for("billing", "1")
    assert uuid.UUID(sending.message_id_for("orders", "1")).version == 5
    assert reporting.choose_bucket(3600) == 30
    assert reporting.choose_bucket(86_400 * 30) == 21_600


def test_alembic_sees_the_ledger_that_lives_in_contrib():
    # The model moved into contrib (the core never imports it); every migration run imports it
    # by name, so `alembic check` and autogenerate still compare it with revision 0006.
    from sqlqueue_orm.migration import configuration

    tables = configuration.shared_metadata().tables
    assert {"OutboxData", "SparkSendLedger"} <= set(tables)
