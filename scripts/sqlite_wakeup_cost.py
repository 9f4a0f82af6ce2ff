"""SQLite's wake-up by ``PRAGMA data_version``: its latency from another process, its idle CPU.

    python scripts/sqlite_wakeup_cost.py [--samples 200] [--idle-seconds 30] [--rounds 2]
                                         [--interval SECONDS]

Latency: an endpoint with the default settings (peek delay 30 s, so only the wake-up explains
a quick pick-up) handles rows another process INSERTs one at a time, 20-80 ms apart; each body
carries the sender's clock just after its commit; p50/p99 of handler start minus that.
Idle CPU: an endpoint process sits idle for ``--idle-seconds``, with the default wake-up and
with ``notify=False``, rounds alternating; its CPU time (user + system, every thread) over that
window, as a share of one core. Figures from a shared machine are noisy: re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlalchemy as sa

from sqlqueue_orm import Transport, db
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.receiving import Endpoint, commit_watcher

QUEUE = "wake"


def _idle(url: str, notify: bool | None, seconds: float, interval: float, results: Any) -> None:
    commit_watcher.INTERVAL = interval
    transport = Transport(db.create_engine(url))
    endpoint = Endpoint(QUEUE, transport, peek_delay=10.0, notify=notify, delayed_delivery=False)
    endpoint.handle_raw(lambda body, context: None)
    endpoint.start()
    time.sleep(1.0)
    before = os.times()
    time.sleep(seconds)
    after = os.times()
    endpoint.stop()
    results.put((after.user - before.user) + (after.system - before.system))


def idle_cpu(url: str, seconds: float, rounds: int, interval: float) -> dict[str, list[float]]:
    """CPU seconds per second of an idle endpoint process, per variant."""
    spawn = multiprocessing.get_context("spawn")
    shares: dict[str, list[float]] = {"data_version watcher": [], "notify=False": []}
    for number in range(rounds):
        variants = [(None, "data_version watcher"), (False, "notify=False")]
        for notify, label in variants if number % 2 == 0 else reversed(variants):
            results = spawn.Queue()
            process = spawn.Process(target=_idle, args=(url, notify, seconds, interval, results))
            process.start()
            shares[label].append(results.get(timeout=seconds + 60) / seconds)
            process.join(30)
    return shares


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval", type=float, default=commit_watcher.INTERVAL)
    args = parser.parse_args()
    commit_watcher.INTERVAL = args.interval
    with tempfile.TemporaryDirectory(prefix="sqlqueue-wake-") as directory:
        url = f"sqlite:///{os.path.join(directory, 'wake.db')}"
        latencies = _latency_pairs(url, args.samples)
        ordered = sorted(latencies)
        p50 = ordered[len(ordered) // 2] * 1000
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
        print(
            f"latency from another process's commit, {len(ordered)} messages, interval "
            f"{args.interval * 1000:g} ms: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        )
        for label, values in idle_cpu(url, args.idle_seconds, args.rounds, args.interval).items():
            print(
                f"idle CPU, {label:<22} {statistics.median(values) * 100:5.2f}% of one core "
                f"(rounds: {', '.join(f'{v * 100:.2f}%' for v in values)})"
            )
    print(f"load {os.getloadavg()[0]:.1f}")


def _latency_pairs(url: str, samples: int) -> list[float]:
    """Per message: handler start minus the sender's commit (read back from the stamps)."""
    engine = db.create_engine(url)
    transport = Transport(engine)
    transport.create_queue(QUEUE)
    with engine.begin() as connection:
        connection.exec_driver_sql(f'CREATE TABLE "{QUEUE}_sent" (id TEXT, at REAL)')
    handled: dict[str, float] = {}
    lock = threading.Lock()
    endpoint = Endpoint(QUEUE, transport, peek_delay=30.0, delayed_delivery=False)

    @endpoint.handle_raw
    def handle(body: bytes, context: Any) -> None:
        with lock:
            handled[body.decode()] = time.time()

    endpoint.start()
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    process = spawn.Process(target=_stamped_sender, args=(url, samples, ready))
    process.start()
    time.sleep(1.0)
    ready.set()
    process.join()
    time.sleep(0.5)
    endpoint.stop()
    with engine.connect() as connection:
        sent = dict(connection.exec_driver_sql(f'SELECT id, at FROM "{QUEUE}_sent"').all())
    engine.dispose()
    return [handled[key] - at for key, at in sent.items() if key in handled]


def _stamped_sender(url: str, samples: int, ready: Any) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    table = queue_table(QUEUE, None, engine.dialect)
    ready.wait()
    stamps: list[tuple[str, float]] = []
    with engine.connect() as connection:
        for number in range(samples):
            time.sleep(random.uniform(0.02, 0.08))  # noqa: S311 (pacing, not secrets)
            key = str(number)
            with connection.begin():
                connection.execute(
                    sa.insert(table).values(
                        Id=uuid.uuid4(), Recoverable=True, Headers="{}", Body=key.encode()
                    )
                )
            stamps.append((key, time.time()))  # just after the commit
        with connection.begin():
            connection.execute(
                sa.text(f'INSERT INTO "{QUEUE}_sent" VALUES (:id, :at)'),
                [{"id": key, "at": at} for key, at in stamps],
            )
    engine.dispose()


if __name__ == "__main__":
    main()
