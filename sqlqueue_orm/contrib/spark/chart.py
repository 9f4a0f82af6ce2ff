"""The report's PNG chart: throughput per endpoint and p95 latency over time (matplotlib, Agg).

Uses matplotlib's object API with the Agg canvas, so it never touches the global backend of
the process it runs in (no display needed, nothing changes for a notebook that imports it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any


def _when(epoch: Any) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC)


def render_chart(
    overall: Sequence[Mapping[str, Any]],
    by_endpoint: Sequence[Mapping[str, Any]],
    bucket_seconds: int,
    path: str,
    *,
    title: str = "Message throughput and latency",
) -> None:
    """Write a two-panel PNG to *path*.

    :param overall: rows of :func:`~sqlqueue_orm.contrib.spark.reporting.throughput` without
        grouping (bucket_epoch, per_second, failed, processing_p95_ms, critical_p95_ms).
    :param by_endpoint: the same per ``processing_endpoint``.
    :param bucket_seconds: the bucket width, for the axis labels.
    :param path: the PNG file to write.
    :param title: the chart's title.
    """
    from matplotlib import dates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 6.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))

    endpoints = sorted({str(row["processing_endpoint"] or "(none)") for row in by_endpoint})
    for endpoint in endpoints:
        rows = [row for row in by_endpoint
                if str(row["processing_endpoint"] or "(none)") == endpoint and row["processed"]]
        top.plot([_when(row["bucket_epoch"]) for row in rows],
                 [row["per_second"] for row in rows], linewidth=1.4, label=endpoint)
    times = [_when(row["bucket_epoch"]) for row in overall]
    top.plot(times, [row["per_second"] for row in overall], color="black", linewidth=1.8,
             linestyle="--", label="all endpoints")
    width = dt.timedelta(seconds=bucket_seconds)
    failed = [row["failed"] / bucket_seconds for row in overall]
    if any(failed):
        top.bar(times, failed, width=width * 0.9, align="edge", color="tab:red", alpha=0.5,
                label="failed")
    top.set_ylabel("messages / second")
    top.set_title(f"{title} ({_bucket_label(bucket_seconds)} buckets, UTC)")
    top.legend(loc="upper left", ncols=min(len(endpoints) + 2, 6), fontsize="small")
    top.grid(alpha=0.3)

    bottom.plot(times, [row["processing_p95_ms"] for row in overall], color="tab:blue",
                label="p95 processing time")
    bottom.plot(times, [row["critical_p95_ms"] for row in overall], color="tab:orange",
                label="p95 critical time")
    bottom.set_ylabel("milliseconds")
    bottom.legend(loc="upper left", fontsize="small")
    bottom.grid(alpha=0.3)
    locator = dates.AutoDateLocator(tz=dt.UTC)  # type: ignore[no-untyped-call]
    bottom.xaxis.set_major_locator(locator)
    formatter = dates.ConciseDateFormatter(locator, tz=dt.UTC)  # type: ignore[no-untyped-call]
    bottom.xaxis.set_major_formatter(formatter)
    figure.savefig(path, format="png")


def _bucket_label(seconds: int) -> str:
    if seconds % 86_400 == 0:
        return f"{seconds // 86_400} d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"
