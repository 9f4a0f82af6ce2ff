"""What the PostgreSQL wake-up trigger costs senders, measured side by side.

    python scripts/wakeup_trigger_cost.py [--interleaved 20000] [--cpu-sends 10000]
                                          [--concurrent 10000] [--rounds 7] [--seconds 2]
                                          [--senders 4] [--durable]

Three figures, each comparing the trigger variants (no trigger; the conditional trigger with
nobody waiting, the default, where only the ``WHEN`` test runs; the conditional trigger with an
endpoint registered as waiting, where every send notifies; the old unconditional ``pg_notify``):

* ``--interleaved``: the median time of a single-row send of one connection, four queue tables
  (one per variant) written in turn statement by statement, so whatever else the machine does
  falls on every variant alike (the steadiest figure on a busy machine);
* ``--cpu-sends``: the server CPU per send of one connection (Linux ``/proc``), variants
  alternating by round, slot counts 1, 2 and 4 included, and a ``WHEN`` that calls a
  function but tries no lock (what any non-constant test costs);
* ``--concurrent``: ``--senders`` processes, each writing tables with the cheapest triggers
  that could tell a waiter from none (a ``WHEN`` that is false, one that calls a function, one
  that reads a sequence, the conditional trigger) and a table without one in turn, statement by
  statement, one INSERT per transaction: what each costs a send under concurrency, with
  whatever else the machine does falling on every variant alike;
* ``--rounds`` x ``--seconds`` (``--seconds 0``: skip it): the rate of ``--senders`` processes,
  one INSERT per transaction, variants alternating by round, medians and their ratio to "no
  trigger".

A throwaway cluster (fsync off; ``--durable``: PostgreSQL's defaults, each commit waits for its
WAL flush), or ``$SQLQUEUE_BENCH_POSTGRES_URL``. Figures from a shared machine are noisy:
re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlalchemy as sa

from sqlqueue_orm import Transport, db, dialects
from sqlqueue_orm.receiving import wakeup

QUEUE = "cost"
OLD_TRIGGER = (
    "CREATE TRIGGER {trigger} AFTER INSERT ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
)


def _insert(table: str) -> str:
    """A single-row send into *table* (quoted), one round trip."""
    return (
        f"INSERT INTO {table} (id, expires, headers, body) "
        "VALUES (gen_random_uuid(), NULL, '{}', '\\x00'::bytea)"
    )


def _senders(
    target: Any, args: tuple[Any, ...], count: int, warm: float, timeout: float
) -> list[Any]:
    """Run *count* processes of ``target(*args, go, results)``; return what each put.

    They go together once *warm* seconds have let each connect and warm up.
    """
    spawn = multiprocessing.get_context("spawn")
    go, results = spawn.Event(), spawn.Queue()
    processes = [spawn.Process(target=target, args=(*args, go, results)) for _ in range(count)]
    for process in processes:
        process.start()
    time.sleep(warm)
    go.set()
    reports = [results.get(timeout=timeout) for _ in processes]
    for process in processes:
        process.join(30)
    return reports


def _sender(url: str, table: str, seconds: float, go: Any, results: Any) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    raw = engine.raw_connection()
    driver: Any = raw.driver_connection
    driver.autocommit = True
    statement = _insert(table)
    driver.execute(statement)  # warm: the plan, the connection
    go.wait()
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        driver.execute(statement)
        count += 1
    results.put(count)
    raw.close()


def _turns(url: str, inserts: dict[str, str], sends: int, go: Any, results: Any) -> None:
    """In another process: each of *inserts* in turn, *sends* times, the order rotating.

    Put the median and the total seconds per statement of each.
    """
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    raw = engine.raw_connection()
    driver: Any = raw.driver_connection
    driver.autocommit = True
    labels = list(inserts)
    for label in labels:  # warm: the plans, the tables' pages, the relation caches
        for _ in range(50):
            driver.execute(inserts[label])
    go.wait()
    times: dict[str, list[float]] = {label: [] for label in labels}
    for number in range(sends):
        shift = number % len(labels)
        for label in labels[shift:] + labels[:shift]:
            began = time.perf_counter()
            driver.execute(inserts[label])
            times[label].append(time.perf_counter() - began)
    results.put({label: (statistics.median(v), sum(v)) for label, v in times.items()})
    raw.close()


def concurrent(url: str, sends: int, senders: int) -> None:
    """Concurrent senders, each writing the variants' tables in turn statement by statement."""
    engine = db.create_engine(url)
    transport = Transport(engine)
    statements = dialects.for_dialect(engine).notify_wakeup
    assert statements is not None
    sequence = "sqlqueue_cost_flag"
    # each WHEN below is false, as the conditional trigger's is with nobody waiting
    whens = {
        "no trigger": None,
        "a trigger whose WHEN is false": "true",
        "a WHEN calling a function, no lock": "pg_backend_pid() > 0",
        "a WHEN reading a sequence, no lock": (
            f"pg_sequence_last_value(CAST('{sequence}' AS regclass)) IS NULL"
        ),
        "conditional, nobody waiting": "",
    }
    inserts = {}
    with engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE SEQUENCE IF NOT EXISTS {sequence}")
    for number, (label, when) in enumerate(whens.items()):
        name = f"t_turn_{number}"
        transport.create_queue(name)
        quoted = str(engine.dialect.identifier_preparer.quote(name))
        if when == "":
            wakeup.ensure_trigger(engine, transport.queues.address(name), required=True)
        elif when is not None:
            with engine.begin() as connection:
                connection.exec_driver_sql(statements.create_function)
                connection.exec_driver_sql(
                    statements.create_trigger.format(table=quoted, when=when)
                )
        inserts[label] = _insert(quoted)
    reports = _senders(_turns, (url, inserts, sends), senders, 2.0, sends * 0.05 + 120)
    print(
        f"\n{senders} senders, one INSERT per transaction, each writing the tables in turn, "
        f"{sends:,} sends per table each; load {os.getloadavg()[0]:.1f}; "
        "no trigger's figure / the variant's:"
    )
    median_base = statistics.median(report["no trigger"][0] for report in reports)
    total_base = sum(report["no trigger"][1] for report in reports)
    for label in whens:
        median = statistics.median(report[label][0] for report in reports)
        total = sum(report[label][1] for report in reports)
        print(
            f"{label:<38} median {median * 1e6:7.1f} us  {median_base / median:5.3f}x   "
            f"mean {total / sends / senders * 1e6:7.1f} us  {total_base / total:5.3f}x"
        )
    engine.dispose()


def _round(url: str, table: str, seconds: float, senders: int) -> float:
    total = sum(_senders(_sender, (url, table, seconds), senders, 1.0, seconds + 60))
    return total / seconds


def _backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process *pid* has used (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(url: str, table: str, variants: dict[str, Any], sends: int, rounds: int) -> None:
    """Server CPU per send of one connection, per variant: steadier than rates on a busy box."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    raw = engine.raw_connection()
    driver: Any = raw.driver_connection
    driver.autocommit = True
    pid = driver.execute("SELECT pg_backend_pid()").fetchone()[0]
    statement = _insert(table)
    costs: dict[str, list[float]] = {label: [] for label in variants}
    for number in range(rounds):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for label in order:
            variants[label]()
            driver.execute(statement)
            before = _backend_cpu(pid)
            for _ in range(sends):
                driver.execute(statement)
            costs[label].append((_backend_cpu(pid) - before) / sends * 1e6)
    print(f"\nserver CPU per send, one connection, {sends:,} sends x {rounds} rounds (median):")
    base = statistics.median(costs[next(iter(costs))])
    for label, values in costs.items():
        median = statistics.median(values)
        print(f"{label:<38} {median:7.1f} us  {median / base:5.3f}x")
    raw.close()
    engine.dispose()


def interleaved(url: str, sends: int) -> None:
    """Median time per single-row send of one connection, the variants' tables taking turns.

    Four queue tables, one per variant, written in turn statement by statement: whatever else
    the machine does falls on every variant alike.
    """
    engine = db.create_engine(url)
    transport = Transport(engine)
    statements = dialects.for_dialect(engine).notify_wakeup
    assert statements is not None
    names = {
        "no trigger": "t_none",
        "conditional, nobody waiting": "t_conditional",
        "conditional, a waiter registered": "t_waited",
        "old unconditional pg_notify": "t_old",
    }
    waiter = engine.raw_connection()
    waiter_driver: Any = waiter.driver_connection
    waiter_driver.autocommit = True
    for label, name in names.items():
        transport.create_queue(name)
        address = transport.queues.address(name)
        if label.startswith("conditional"):
            wakeup.ensure_trigger(engine, address, required=True)
        if label.endswith("registered"):
            with engine.connect() as connection:
                key = wakeup.queue_key(connection, address)
            assert waiter_driver.execute(statements.register_statement(key)).fetchone()[0]
        if label.startswith("old"):
            quoted = str(engine.dialect.identifier_preparer.quote(name))
            with engine.begin() as connection:
                connection.exec_driver_sql(statements.create_function)
                connection.exec_driver_sql(
                    OLD_TRIGGER.format(
                        trigger=statements.trigger, table=quoted, function=statements.function
                    )
                )
    raw = sa.create_engine(url, poolclass=sa.pool.NullPool).raw_connection()
    driver: Any = raw.driver_connection
    driver.autocommit = True
    inserts = {label: _insert(name) for label, name in names.items()}
    times: dict[str, list[float]] = {label: [] for label in names}
    for _ in range(sends):
        for label, statement in inserts.items():
            began = time.perf_counter()
            driver.execute(statement)
            times[label].append(time.perf_counter() - began)
    print(f"\nmedian time per send, one connection, {sends:,} sends each, tables in turn:")
    base = statistics.median(times["no trigger"])
    for label, values in times.items():
        median = statistics.median(values)
        print(f"{label:<38} {median * 1e6:7.1f} us  {median / base:5.3f}x")
    raw.close()
    waiter.close()
    engine.dispose()


def _rates(
    args: argparse.Namespace,
    url: str,
    table: str,
    variants: dict[str, Callable[[], None]],
    reset: Callable[[], None],
) -> None:
    """Print the send rate under each of *variants* (installed in turn), over *args.rounds*.

    The order of the variants alternates from round to round; *reset* empties the table and
    lets go of the waiter's slot after each.
    """
    rates: dict[str, list[float]] = {label: [] for label in variants}
    for number in range(args.rounds):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for label in order:
            variants[label]()
            rates[label].append(_round(url, table, args.seconds, args.senders))
            reset()
        print(f"round {number + 1}: " + ", ".join(f"{rates[k][-1]:,.0f}" for k in variants))
    base = statistics.median(rates["no trigger"])
    print(
        f"\n{args.senders} senders, one INSERT per transaction, {args.rounds} rounds of "
        f"{args.seconds:g} s, {'durable' if args.durable else 'fsync off'}; load "
        f"{os.getloadavg()[0]:.1f}"
    )
    for label, values in rates.items():
        median = statistics.median(values)
        print(f"{label:<38} {median:9,.0f} sends/s  {median / base:5.3f}x")


def main() -> None:
    """Measure and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=2.0, help="0: skip the rates")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--cpu-sends", type=int, default=5_000, help="0: skip the CPU figures")
    parser.add_argument(
        "--interleaved", type=int, default=5_000, help="sends per table taking turns (0: skip)"
    )
    parser.add_argument(
        "--concurrent",
        type=int,
        default=5_000,
        help="sends per table and sender, the senders taking turns over the tables (0: skip)",
    )
    args = parser.parse_args()
    server = os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL")
    if not server:
        from testsupport import pg_cluster

        server = pg_cluster.start(durable=args.durable).url()
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    name = f"sqlqueue_cost_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(server).set(database=name).render_as_string(hide_password=False)
    engine = db.create_engine(url)
    transport = Transport(engine)
    transport.create_queue(QUEUE)
    address = transport.queues.address(QUEUE)
    statements = dialects.for_dialect(engine).notify_wakeup
    assert statements is not None
    table = str(engine.dialect.identifier_preparer.quote(QUEUE))
    with engine.connect() as connection:
        key = wakeup.queue_key(connection, address)
    waiter = engine.raw_connection()
    waiter_driver: Any = waiter.driver_connection
    waiter_driver.autocommit = True

    def none() -> None:
        waiter_driver.execute("SELECT pg_advisory_unlock_all()")  # no waiter left registered
        wakeup.remove_trigger(engine, address)

    def conditional() -> None:
        waiter_driver.execute("SELECT pg_advisory_unlock_all()")
        wakeup.ensure_trigger(engine, address, required=True)

    def waiting() -> None:
        conditional()
        slot = waiter_driver.execute(statements.register_statement(key)).fetchone()[0]
        assert slot is not None

    def old() -> None:
        none()
        with engine.begin() as connection:
            connection.exec_driver_sql(statements.create_function)
            connection.exec_driver_sql(
                OLD_TRIGGER.format(
                    trigger=statements.trigger, table=table, function=statements.function
                )
            )

    def slots(count: int) -> Any:
        def install() -> None:
            narrower = dataclasses.replace(statements, slots=count)
            none()
            with engine.begin() as connection:
                connection.exec_driver_sql(statements.create_function)
                connection.exec_driver_sql(narrower.trigger_statement(table, key))

        return install

    def never() -> None:  # the trigger's own overhead, no lock tried
        none()
        with engine.begin() as connection:
            connection.exec_driver_sql(statements.create_function)
            connection.exec_driver_sql(statements.create_trigger.format(table=table, when="true"))

    def call_only() -> None:  # a WHEN that calls a function, as the slot test does, but no lock
        none()
        with engine.begin() as connection:
            connection.exec_driver_sql(statements.create_function)
            connection.exec_driver_sql(
                statements.create_trigger.format(table=table, when="pg_backend_pid() > 0")
            )

    if args.interleaved:
        interleaved(url, args.interleaved)
    if args.concurrent:
        concurrent(url, args.concurrent, args.senders)
    if args.cpu_sends:
        server_cpu(
            url,
            table,
            {
                "no trigger": none,
                "a trigger whose WHEN is false": never,
                "a WHEN calling a function, no lock": call_only,
                "conditional, 1 slot": slots(1),
                "conditional, 2 slots": slots(2),
                "conditional, 4 slots": slots(4),
                "conditional, a waiter registered": waiting,
                "old unconditional pg_notify": old,
            },
            args.cpu_sends,
            args.rounds,
        )
        waiter_driver.execute("SELECT pg_advisory_unlock_all()")
    if args.seconds:
        variants = {
            "no trigger": none,
            "conditional, nobody waiting": conditional,
            "conditional, one waiter registered": waiting,
            "old unconditional pg_notify": old,
        }

        def reset() -> None:
            waiter_driver.execute("SELECT pg_advisory_unlock_all()")
            with engine.begin() as connection:
                connection.exec_driver_sql(f"TRUNCATE {table}")

        _rates(args, url, table, variants, reset)
    waiter.close()
    engine.dispose()
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
