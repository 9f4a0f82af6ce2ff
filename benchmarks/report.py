"""The run's outputs: a markdown table on stdout, JSON and a PNG chart under ``results/``.

Ratios are ours divided by the other side, same database and scenario, same run: above 1 we are
faster. Derived figures (the ratios targets are set on) follow the table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from collections.abc import Iterable
from typing import Any

from benchmarks import baselines, bench_wakeup, workers
from benchmarks.workload import Result

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

#: Columns of ratios, in order: (heading, side divided by).
RATIO_COLUMNS = (
    ("÷ raw autocommit", baselines.AUTOCOMMIT),
    ("÷ raw BEGIN/COMMIT", baselines.TRANSACTION),
    ("÷ kombu", workers.KOMBU),
    ("÷ PGQueuer asyncpg", workers.PGQUEUER_ASYNCPG),
    ("÷ PGQueuer psycopg", workers.PGQUEUER_PSYCOPG),
)


def machine() -> dict[str, Any]:
    """Cores, CPU model, load: what the figures were measured on."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cores": os.cpu_count(), "cpu": model, "load_average": [round(x, 2) for x in load],
            "python": platform.python_version(), "platform": platform.platform(),
            "commit": _commit()}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False, cwd=os.path.dirname(RESULTS))
        return out.stdout.strip()
    except OSError:
        return ""


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _is_ours(side: str) -> bool:
    return side.startswith(workers.OURS) or side == "sqlqueue migrate"


def markdown(results: list[Result], ours_only: bool = False) -> str:
    """The results as one markdown table, then the derived figures.

    :param ours_only: only our rows (with their ratios) and the derived figures: the README's
        short table.
    """
    by_cell = {(r.database, r.scenario, r.side): r for r in results if not r.skipped}
    lines = [
        "| database | scenario | side | msg/s | p50 ms | p99 ms | "
        + " | ".join(heading for heading, _ in RATIO_COLUMNS) + " |",
        "|---|---|---|---:|---:|---:|" + "---:|" * len(RATIO_COLUMNS),
    ]
    for result in results:
        if ours_only and (result.skipped or not _is_ours(result.side)):
            continue
        if result.skipped:
            lines.append(f"| {result.database} | {result.scenario} | {result.side} | "
                         f"skipped: {result.skipped} | | | " + "| " * len(RATIO_COLUMNS))
            continue
        ratios = []
        for _, other in RATIO_COLUMNS:
            base = by_cell.get((result.database, result.scenario, other))
            show = _is_ours(result.side) and base is not None and base.rate > 0
            ratios.append(f"{result.rate / base.rate:.2f}" if show and base else "")
        lines.append(
            f"| {result.database} | {result.scenario} | {result.side} | {result.rate:,.0f} | "
            f"{_fmt(result.p50_ms)} | {_fmt(result.p99_ms)} | " + " | ".join(ratios) + " |"
        )
    aimed = [r for r in results if r.target and not r.skipped]
    if aimed:
        lines += ["", "Targets, and what this run measured against them:", "",
                  "| database | line | measured | target | met |", "|---|---|---|---|---|"]
        lines += [f"| {r.database} | {r.scenario} | {r.measured} | {r.target} | "
                  f"{'yes' if r.met else 'NO'} |" for r in aimed]
    derived = list(derived_figures(results))
    if derived:
        lines += ["", "| database | derived figure | value |", "|---|---|---:|"]
        lines += [f"| {database} | {what} | {value} |" for database, what, value in derived]
    if not ours_only:
        lines += bench_wakeup.comparison(results)
    return "\n".join(lines)


def derived_figures(results: list[Result]) -> Iterable[tuple[str, str, str]]:
    """Deep/shallow, dispatcher/direct: the ratios targets are set on."""
    by_cell = {(r.database, r.scenario, r.side): r for r in results if not r.skipped}
    for database in sorted({r.database for r in results}):
        receives = sorted(
            (r for r in results if r.database == database and not r.skipped
             and r.side == workers.OURS and r.scenario.startswith("receive 1/txn, ")
             and r.scenario.endswith(" waiting")),
            key=lambda r: int(r.scenario.split(", ")[1].split()[0].replace(",", "")))
        if len(receives) >= 2:
            shallow, deep = receives[0], receives[-1]
            yield (database, f"receive rate, {deep.scenario.split(', ')[1]} ÷ "
                   f"{shallow.scenario.split(', ')[1]}", f"{deep.rate / shallow.rate:.2f}")
            peeks = [by_cell.get((database, "peek, " + r.scenario.split(", ")[1], workers.OURS))
                     for r in (shallow, deep)]
            if peeks[0] and peeks[1] and peeks[0].p50_ms:
                yield (database, "peek p50, deep ÷ shallow",
                       f"{(peeks[1].p50_ms or 0) / peeks[0].p50_ms:.2f}")
        dispatcher = by_cell.get((database, "outbox dispatcher, backlog", workers.OURS))
        direct = by_cell.get((database, "send 1/txn", workers.OURS))
        if dispatcher and direct:
            yield (database, "outbox dispatcher ÷ direct sends (1/txn)",
                   f"{dispatcher.rate / direct.rate:.2f}")
        units = [by_cell.get((database, "unit of work, 1 send", f"{workers.OURS} {mode}"))
                 for mode in ("outbox", "direct")]
        if units[0] and units[1]:
            yield (database, "unit of work with outbox ÷ direct",
                   f"{units[0].rate / units[1].rate:.2f}")
        senders = {side: by_cell.get((database, bench_wakeup.SENDERS, side))
                   for side in (bench_wakeup.DEFAULT, bench_wakeup.UNCONDITIONAL)}
        none = by_cell.get((database, bench_wakeup.SENDERS, bench_wakeup.NO_TRIGGER))
        for side, cell in senders.items():
            if cell and none and none.rate > 0:
                yield (database, f"{bench_wakeup.SENDERS}: {side} ÷ no trigger",
                       f"{cell.rate / none.rate:.3f}")
        for result in results:
            if result.database == database and result.side == workers.PUMP:
                raw = by_cell.get((database, result.scenario, workers.RAW_LOOP))
                if raw and raw.rate > 0:
                    yield (database, f"{result.scenario}: pump ÷ raw receive loop",
                           f"{result.rate / raw.rate:.2f}")


def write(results: list[Result], info: dict[str, Any], table: str) -> tuple[str, str | None]:
    """Write ``results/run-<time>.json`` and ``latest.json``, and the chart; return paths."""
    os.makedirs(RESULTS, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    document = {"finished": stamp, **info, "results": [r.to_json() for r in results],
                "markdown": table}
    path = os.path.join(RESULTS, f"run-{stamp}.json")
    for target in (path, os.path.join(RESULTS, "latest.json")):
        with open(target, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
    return path, chart(results, os.path.join(RESULTS, "latest.png"))


def chart(results: list[Result], path: str) -> str | None:
    """A horizontal bar chart of msg/s per scenario and side, one panel per database."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    measured = [r for r in results if not r.skipped and not r.scenario.startswith("peek")]
    databases = sorted({r.database for r in measured})
    if not databases:
        return None
    heights = [len([r for r in measured if r.database == d]) for d in databases]
    figure, axes = plt.subplots(len(databases), 1, figsize=(11, 0.28 * sum(heights) + 2),
                                gridspec_kw={"height_ratios": heights}, squeeze=False)
    colours = {workers.OURS: "tab:blue", workers.OURS_TX: "tab:cyan",
               workers.OURS_KEPT: "tab:purple",
               baselines.AUTOCOMMIT: "tab:gray", baselines.TRANSACTION: "silver",
               workers.KOMBU: "tab:red", workers.PGQUEUER_ASYNCPG: "tab:green",
               workers.PGQUEUER_PSYCOPG: "tab:olive"}
    for axis, database in zip(axes[:, 0], databases, strict=True):
        rows = [r for r in measured if r.database == database][::-1]
        axis.barh([f"{r.scenario} | {r.side}" for r in rows], [r.rate for r in rows],
                  color=[colours.get(r.side, "tab:blue") for r in rows])
        axis.set_xscale("log")
        axis.set_title(database)
        axis.set_xlabel("messages/s (log)")
        axis.tick_params(axis="y", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
