"""The dashboard's samples: written to the shared metrics table, read back by anyone; the chart."""

from __future__ import annotations

import datetime as dt

from sqlqueue_orm import OutgoingMessage, Transport, headers, health
from sqlqueue_orm.contrib.dashboard import rendering, sampling


def test_samples_go_to_the_metrics_table_and_survive_the_dashboard(tmp_path):
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    transport = Transport(url)
    transport.create_queue("orders")
    an_hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    transport.send(
        "orders",
        OutgoingMessage(b"old", headers={headers.TIME_SENT: headers.format_time(an_hour_ago)}),
    )
    sampler = sampling.DepthSampler(transport, transport.list_queues)
    sampler.sample_once()
    transport.close()

    reader = Transport(url)  # a dashboard started later reads what the first one wrote
    try:
        found = health.read_queue_metrics(reader.engine, ["orders", "nowhere"])
    finally:
        reader.close()
    [sample] = found["orders"].samples
    assert (sample.depth, sample.processed, sample.failed) == (1, 0, 0)
    assert sample.oldest_age is not None and 3599 <= sample.oldest_age < 3700
    assert found["nowhere"].samples == []


def test_a_failing_read_is_logged_once_and_sampling_goes_on(tmp_path, caplog):
    transport = Transport(f"sqlite:///{tmp_path / 'queue.db'}")
    transport.create_queue("orders")
    answers: list[object] = [RuntimeError("down"), RuntimeError("down"), [("orders", 0)]]

    def read():  # type: ignore[no-untyped-def]
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sampler = sampling.DepthSampler(transport, read)
    for _ in range(3):
        sampler.sample_once()
    warnings = [r for r in caplog.records if "cannot sample" in r.getMessage()]
    assert len(warnings) == 1
    [sample] = health.read_queue_metrics(transport.engine, ["orders"])["orders"].samples
    assert sample.depth == 0 and sample.oldest_age is None
    transport.close()


def test_chart_and_hex_view():
    samples = [sampling.Sample(1000.0, 0), sampling.Sample(1000.0 + 1800, 10)]
    svg = rendering.depth_chart(samples, now=1000.0 + 3600)
    assert 'points="0.0,46.0 120.0,12.0"' in svg and "highest 10" in svg
    # A history shorter than an hour fills the width (at least 10 s).
    young = rendering.depth_chart([sampling.Sample(0.0, 1), sampling.Sample(60.0, 1)], now=120.0)
    assert 'points="0.0,12.0 120.0,12.0"' in young and "last 2 min" in young
    assert "no readings yet" in rendering.depth_chart([], now=0)
    day = rendering.depth_chart(
        [sampling.Sample(0.0, 2.5)], now=86400.0, label="oldest message's age", window=86400
    )
    assert "oldest message&#x27;s age over the last 24 h" in day and "highest 2.5" in day
    assert rendering.hex_view(b"AB\x00") == "00000000  41 42 00" + " " * 41 + "|AB.|"


def test_a_database_not_there_at_first_is_logged_once_and_sampled_once_it_is(tmp_path, caplog):
    """The tables cannot be made yet (no folder for the file): logged, not raised, and the
    sampling that follows works once the database can be reached."""
    folder = tmp_path / "later"
    transport = Transport(f"sqlite:///{folder / 'queue.db'}")
    sampler = sampling.DepthSampler(transport, lambda: [("orders", 0)])
    sampler.sample_once()
    sampler.sample_once()
    folder.mkdir()
    sampler.sample_once()
    messages = [record.getMessage() for record in caplog.records]
    assert len([text for text in messages if "cannot sample" in text]) == 1
    assert len([text for text in messages if "works again" in text]) == 1
    [sample] = health.read_queue_metrics(transport.engine, ["orders"])["orders"].samples
    assert sample.depth == 0
    transport.close()
