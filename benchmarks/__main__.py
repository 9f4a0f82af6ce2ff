"""``python -m benchmarks [--quick] [--only receive,send] [--databases sqlite,postgresql]``.

``--only wakeup,pump,batch`` is the wake-up comparison: the wake-up cells printed beside the
pump and batched burn-down cells they must not slow (run it before and after a change).

Runs every scenario on a SQLite file and on PostgreSQL (a throwaway cluster unless
``$SQLQUEUE_BENCH_POSTGRES_URL`` is set), prints the markdown table, writes JSON and a PNG chart
under ``benchmarks/results/``. Exit 2 on bad arguments; a scenario or peer that fails is
reported in the table, not fatal (``SQLQUEUE_BENCH_STRICT=1`` makes it fatal).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from benchmarks import harness, report, scenarios, servers
from benchmarks.workload import Result


def _names(text: str, allowed: tuple[str, ...], what: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    bad = sorted(names - set(allowed))
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(bad) or repr(text)} (choose from {', '.join(allowed)})")
    return names


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, harness.Settings]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="100,000 instead of 1,000,000 waiting / migrated; 2,000 messages; "
                        "shorter wake-up cells")
    parser.add_argument("--only", type=lambda t: _names(t, harness.NAMES, "scenario"),
                        default=frozenset(harness.NAMES),
                        help=f"comma-separated scenarios: {', '.join(harness.NAMES)}")
    parser.add_argument("--databases", type=lambda t: _names(t, ("sqlite", "postgresql"),
                                                             "database"),
                        default=frozenset({"sqlite", "postgresql"}))
    parser.add_argument("--messages", type=int, help="messages per send/receive cell")
    parser.add_argument("--deep", type=int, help="messages waiting in the deep-queue cell")
    parser.add_argument("--migrate-rows", type=int, help="rows of the v1 table to migrate")
    parser.add_argument("--burn-down", type=int,
                        help="backlog the batched pump burns down (default 1,000,000)")
    parser.add_argument("--failed-messages", type=int,
                        help="error-queue size of scenario groups (default 100,000)")
    parser.add_argument("--peer-messages", type=int, help="messages per kombu/PGQueuer cell")
    parser.add_argument("--wakeup-samples", type=int,
                        help="idle messages of the wake-up cell (default 400)")
    parser.add_argument("--wakeup-seconds", type=float,
                        help="seconds of the sustained 300 msg/s cell (default 10)")
    parser.add_argument("--sender-rounds", type=int,
                        help="rounds of each side of the four-sender cell (default 10; an odd "
                        "count is rounded up, so each side goes first as often)")
    parser.add_argument("--sender-seconds", type=float,
                        help="seconds of each four-sender round (default 3)")
    parser.add_argument("--receive-rounds", type=int,
                        help="rounds the send and receive cells alternate their sides in "
                        "(default 5)")
    parser.add_argument("--cli-rounds", type=int,
                        help="rounds of the CLI start-up cell (default 15)")
    parser.add_argument("--no-peers", action="store_true", help="skip kombu and PGQueuer")
    parser.add_argument("--no-write", action="store_true", help="print only; write no files")
    args = parser.parse_args(argv)
    settings = harness.Settings(only=args.only, peers=not args.no_peers)
    if args.quick:
        settings = dataclasses.replace(settings, messages=2_000, deep=100_000, peer_messages=500,
                                       migrate_rows=100_000, burn_down=100_000,
                                       wakeup_samples=100, wakeup_seconds=3.0, sender_rounds=6,
                                       sender_seconds=1.5,
                                       failed_messages=10_000, cli_rounds=5)
    for field, value in (("messages", args.messages), ("deep", args.deep),
                         ("migrate_rows", args.migrate_rows),
                         ("peer_messages", args.peer_messages),
                         ("burn_down", args.burn_down),
                         ("wakeup_samples", args.wakeup_samples),
                         ("sender_rounds", args.sender_rounds),
                         ("receive_rounds", args.receive_rounds),
                         ("failed_messages", args.failed_messages),
                         ("cli_rounds", args.cli_rounds)):
        if value is not None:
            if value < 1:
                parser.error(f"--{field.replace('_', '-')} {value} must be at least 1")
            settings = dataclasses.replace(settings, **{field: value})
    for field, seconds in (("wakeup_seconds", args.wakeup_seconds),
                           ("sender_seconds", args.sender_seconds)):
        if seconds is not None:
            if not seconds > 0:
                parser.error(f"--{field.replace('_', '-')} {seconds} must be above 0")
            settings = dataclasses.replace(settings, **{field: seconds})
    if settings.messages % settings.batch:
        settings = dataclasses.replace(settings, batch=min(settings.batch, settings.messages))
    return args, settings


def main(argv: list[str] | None = None) -> int:
    args, settings = parse(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    info = report.machine()
    info["settings"] = {k: sorted(v) if isinstance(v, frozenset) else v
                        for k, v in dataclasses.asdict(settings).items()}
    results: list[Result] = []
    started = time.perf_counter()
    with servers.temporary_directory() as directory:
        databases = []
        if "sqlite" in args.databases:
            databases.append(servers.sqlite(directory))
        if "postgresql" in args.databases:
            try:
                databases.append(servers.postgresql())
            except Exception as error:
                log(f"PostgreSQL unavailable: {error}")
                results.append(Result("postgresql", "(all)", "(server)",
                                      skipped=f"no server: {error}"))
        for database in databases:
            log(f"{database.label}: {database.url if database.name == 'sqlite' else ''}")
            scenarios.run_all(database, settings, results, log)
    info["seconds"] = round(time.perf_counter() - started, 1)
    info["load_average_end"] = report.machine()["load_average"]
    info["databases"] = {d.name: d.label for d in databases}
    table = report.markdown(results)
    print(table)
    print("\nOurs, with the ratios (the README's table):\n")
    print(report.markdown(results, ours_only=True))
    print(f"\n{info['cores']} cores, {info['cpu']}, load {info['load_average']} at start, "
          f"{info['load_average_end']} at end; {info['seconds']} s")
    if not args.no_write:
        path, png = report.write(results, info, table)
        log(f"wrote {path}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
