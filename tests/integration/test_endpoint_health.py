"""Endpoint heartbeats and queue metrics: written by running endpoints, read back by anyone.

A running endpoint's row shows the counts it handled and says running; a clean stop says
stopped; a killed process says stale once three beats are missing; the samples an endpoint
wrote are there for a new Transport to read; the head's age comes from its TimeSent header.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from sqlqueue_orm import OutgoingMessage, connections, control, db, dialects, headers, health
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.receiving import Endpoint, HandlerContext
from tests.conftest import only
from tests.endpoint_app import Job
from tests.health_app import BEAT, BEATING
from testsupport.outbox_app import REPO

T = TypeVar("T")


def eventually(read: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    """Poll *read* until *done* holds (a generous deadline: the machine may be loaded)."""
    deadline = time.monotonic() + 60
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what}: last read {value!r}"
        time.sleep(0.05)


@only("sqlite", "postgresql")
def test_the_beat_reports_the_concurrency_a_live_resize_set(database):
    transport = database.transport()
    transport.create_queue("health-resized")
    endpoint = Endpoint(
        "health-resized", transport, peek_delay=0.1, concurrency=2, heartbeat_interval=BEAT
    )
    endpoint.handle(Job, lambda job, context: None)
    endpoint.start()
    try:
        eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: len(found) == 1 and found[0].concurrency == 2,
            "the configured concurrency",
        )
        control.set_concurrency(transport, "health-resized", 5)
        eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: len(found) == 1 and found[0].concurrency == 5,
            "the concurrency the resize set",
        )
    finally:
        assert endpoint.stop()


@only("sqlite", "postgresql")
def test_a_running_endpoint_beats_with_its_counts_and_a_clean_stop_says_stopped(database):
    transport = database.transport()
    endpoint = Endpoint("health-orders", transport, settings=BEATING)

    def handle(job: Job, context: HandlerContext) -> None:
        if job.fail:
            raise RuntimeError("refused")

    endpoint.handle(Job, handle)
    endpoint.start()
    try:
        transport.send_many(
            "health-orders",
            [OutgoingMessage(Job(number=n, fail=n == 0)) for n in range(5)],
        )
        [instance] = eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: len(found) == 1 and (found[0].processed, found[0].failed) == (4, 1),
            "the heartbeat's counts",
        )
        assert instance.endpoint == "health-orders"
        assert instance.state == health.RUNNING
        assert instance.process_id == os.getpid()
        assert instance.host
        assert instance.concurrency == 2
        assert instance.beat_interval == BEAT
    finally:
        assert endpoint.stop()
    [stopped] = health.read_endpoints(database.engine)
    assert (stopped.state, stopped.processed, stopped.failed) == (health.STOPPED, 4, 1)
    # long after, a stopped instance is still stopped, never stale
    [later] = health.read_endpoints(database.engine, now=time.time() + 3600)
    assert later.state == health.STOPPED

    # the samples survive the endpoint: another engine reads them, none counted twice
    reader = db.create_engine(database.url)
    try:
        metrics = health.read_queue_metrics(reader, ["health-orders"])["health-orders"]
    finally:
        reader.dispose()
    assert sum(sample.processed for sample in metrics.samples) == 4
    assert sum(sample.failed for sample in metrics.samples) == 1
    assert metrics.latest is not None and metrics.latest.depth == 0


@only("sqlite", "postgresql")
def test_a_killed_endpoint_shows_stale_after_three_missed_beats(database):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.health_app", database.url, "health-killed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started", process.stderr.read()
        [running] = eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: len(found) == 1 and found[0].state == health.RUNNING,
            "the first beat",
        )
        assert running.process_id == process.pid
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
        [stale] = eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: found[0].state == health.STALE,
            "stale after the kill",
        )
        assert stale.silent_for > health.STALE_BEATS * BEAT
        assert stale.instance_id == running.instance_id
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


@only("sqlite", "postgresql")
def test_the_oldest_message_age_comes_from_the_head_rows_time_sent(database):
    transport = database.transport()
    transport.create_queue("health-waiting")
    two_minutes_ago = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)
    transport.send(
        "health-waiting",
        OutgoingMessage(b"old", headers={headers.TIME_SENT: headers.format_time(two_minutes_ago)}),
    )
    transport.send("health-waiting", OutgoingMessage(b"new"))
    depth, oldest = health.read_head(transport, "health-waiting")
    assert depth == 2
    assert oldest is not None and 119 <= oldest < 180
    transport.receive("health-waiting", 2)
    assert health.read_head(transport, "health-waiting") == (0, None)


@pytest.mark.parametrize("interval", [0, -1, "5", float("nan")])
def test_a_bad_heartbeat_interval_is_refused_naming_it(interval):
    from sqlqueue_orm import exceptions
    from sqlqueue_orm.receiving import EndpointSettings

    with pytest.raises(exceptions.ConfigurationError, match="heartbeat_interval"):
        EndpointSettings(heartbeat_interval=interval)


@only("sqlite", "postgresql")
def test_heartbeats_off_write_nothing(database):
    transport = database.transport()
    with Endpoint("health-quiet", transport, peek_delay=0.1, heartbeat_interval=None) as endpoint:
        endpoint.handle(Job, lambda job, context: None)
        endpoint.start()
        transport.send("health-quiet", OutgoingMessage(Job(number=1)))
        eventually(lambda: endpoint.stats.handled, lambda handled: handled == 1, "handled")
    assert health.read_endpoints(database.engine) == []


@only("sqlite", "postgresql")
def test_rows_older_than_a_day_are_pruned_and_newer_ones_kept(database):
    engine = database.engine
    own = connections.ThreadConnections(
        engine, dialects.for_dialect(engine).begin, sql.for_dialect(engine.dialect).autocommit
    )
    health.create_tables(engine)
    now = time.time()
    day = health.RETENTION
    for instance, age in (("old", day + 60), ("new", day - 60)):
        beat = health.Heartbeat(instance, "sales", "host", 1, now - age, 5.0, 1, 0, 0, 0, 0, 0)
        health.beat(engine, beat)
        health.beat(engine, beat, alone=own)  # the row exists: one UPDATE alone
        with database.engine.begin() as connection:
            connection.execute(
                health.ENDPOINTS.update()
                .where(health.ENDPOINTS.c.instance_id == instance)
                .values(last_seen=now - age)
            )
        sample = health.QueueSample(now - age, 1, None, 1, 0)
        health.write_samples(database.engine, instance, [("sales", sample)])
    own.close()
    health.prune(database.engine, now)
    assert [found.instance_id for found in health.read_endpoints(database.engine, now)] == ["new"]
    metrics = health.read_queue_metrics(database.engine, ["sales"], window=2 * day, now=now)
    assert [sample.at for sample in metrics["sales"].samples] == [now - day + 60]


def test_settings_replaced_before_start_are_the_ones_the_endpoint_runs_with(database):
    """``sqlqueue run --concurrency`` replaces ``endpoint.settings`` after construction."""
    transport = database.transport()
    endpoint = Endpoint("health-resized", transport, peek_delay=0.1, heartbeat_interval=BEAT)
    endpoint.handle(Job, lambda job, context: None)
    endpoint.settings = endpoint.settings.replace(concurrency=3)
    with endpoint:
        endpoint.start()
        [instance] = eventually(
            lambda: health.read_endpoints(database.engine),
            lambda found: len(found) == 1,
            "the heartbeat",
        )
    assert instance.concurrency == 3
