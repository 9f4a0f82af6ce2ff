"""The dashboard's depth history: an hour of readings, the net rate per minute, the chart."""

from __future__ import annotations

from sqlqueue_orm.contrib.dashboard import rendering, sampling


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def test_rate_is_the_net_change_per_minute_over_the_last_hour():
    clock = Clock()
    sampler = sampling.DepthSampler(lambda: [], clock=clock)
    assert sampler.rate("orders") is None
    sampler.record([("orders", 100)], at=clock.now - 600)
    assert sampler.rate("orders") is None  # one reading says nothing of a rate
    sampler.record([("orders", 40)], at=clock.now)
    assert sampler.rate("orders") == -6.0  # drained 60 in 10 minutes
    sampler.record([("orders", 1000)], at=clock.now - 2 * sampling.WINDOW)  # too old to count
    assert [s.depth for s in sampler.series("orders")] == [100, 40]


def test_readings_older_than_an_hour_are_forgotten():
    clock = Clock()
    sampler = sampling.DepthSampler(lambda: [("orders", 5)], clock=clock)
    sampler.sample_once()
    clock.now += sampling.WINDOW + 1
    sampler.sample_once()
    assert len(sampler.series("orders")) == 1


def test_a_failing_read_is_logged_once_and_sampling_goes_on(caplog):
    answers: list[object] = [RuntimeError("down"), RuntimeError("down"), [("orders", 3)]]

    def read():  # type: ignore[no-untyped-def]
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sampler = sampling.DepthSampler(read)
    for _ in range(3):
        sampler.sample_once()
    warnings = [r for r in caplog.records if "cannot sample" in r.getMessage()]
    assert len(warnings) == 1
    assert [s.depth for s in sampler.series("orders")] == [3]


def test_chart_and_hex_view():
    samples = [sampling.Sample(1000.0, 0), sampling.Sample(1000.0 + 1800, 10)]
    svg = rendering.depth_chart(samples, now=1000.0 + 3600)
    assert 'points="0.0,46.0 120.0,12.0"' in svg and "highest 10" in svg
    # A history shorter than an hour fills the width (at least 10 s).
    young = rendering.depth_chart([sampling.Sample(0.0, 1), sampling.Sample(60.0, 1)], now=120.0)
    assert 'points="0.0,12.0 120.0,12.0"' in young and "last 2 min" in young
    assert "no readings yet" in rendering.depth_chart([], now=0)
    assert rendering.hex_view(b"AB\x00") == "00000000  41 42 00" + " " * 41 + "|AB.|"
