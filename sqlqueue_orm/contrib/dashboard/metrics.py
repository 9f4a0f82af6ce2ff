"""What the queue pages show of the metrics table: rates, the oldest message, the charts.

Read with :func:`sqlqueue_orm.health.read_queue_metrics` (samples of the endpoints and of the
dashboard's own sampler, merged per minute). The queues page charts the last hour of depth; a
queue's page charts the last day of depth, the oldest message's age, and processed and failed
per minute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlqueue_orm import health
from sqlqueue_orm.contrib.dashboard import rendering, sampling
from sqlqueue_orm.transport import Transport

#: Minutes before now the rates shown are averaged over.
RATE_MINUTES = 5


def _age(seconds: float | None) -> str | None:
    return None if seconds is None else health.format_duration(seconds)


def queue_rows(transport: Transport, depths: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """The queues page's rows: depth now, oldest message, rates, the last hour's depth chart."""
    now = time.time()
    found = health.read_queue_metrics(
        transport.engine, [name for name, _depth in depths], sampling.WINDOW, now
    )
    rows = []
    for name, depth in depths:
        metrics = found[name]
        latest = metrics.latest
        readings = [*sampling.series(metrics, "depth"), sampling.Sample(now, depth)]
        rows.append(
            {
                "name": name,
                "depth": depth,
                "oldest": _age(latest.oldest_age) if latest is not None and depth else None,
                "processed": metrics.per_minute("processed", RATE_MINUTES, now),
                "failed": metrics.per_minute("failed", RATE_MINUTES, now),
                "chart": rendering.depth_chart(readings, now),
            }
        )
    return rows


def queue_page(transport: Transport, name: str) -> dict[str, Any]:
    """A queue's page: its latest sample and the last day's charts."""
    now = time.time()
    metrics = health.read_queue_metrics(transport.engine, [name], sampling.DAY, now)[name]
    latest = metrics.latest

    def chart(field: str, label: str) -> str:
        return rendering.depth_chart(
            sampling.series(metrics, field), now, width=480, label=label, window=sampling.DAY
        )

    return {
        "sampled": latest is not None,
        "latest_at": None if latest is None else health.format_duration(now - latest.at),
        "latest_depth": None if latest is None else latest.depth,
        "oldest": None if latest is None else _age(latest.oldest_age),
        "processed": metrics.per_minute("processed", RATE_MINUTES, now),
        "failed": metrics.per_minute("failed", RATE_MINUTES, now),
        "processed_total": sum(sample.processed for sample in metrics.samples),
        "failed_total": sum(sample.failed for sample in metrics.samples),
        "charts": [
            ("depth", chart("depth", "depth")),
            ("oldest message (seconds waited)", chart("oldest_age", "oldest message's age")),
            ("processed per minute", chart("processed", "processed per minute")),
            ("failed per minute", chart("failed", "failed per minute")),
        ],
    }
