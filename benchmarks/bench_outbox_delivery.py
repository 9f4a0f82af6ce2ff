"""Outbox delivery benchmark: dispatch rate to a queue in another database, check on and off.

For SQLite (two files) and PostgreSQL (two databases in a throwaway cluster) and batch sizes 1
and 100, it stores N outbox records of one message each for ``ledger`` in the other database and
times ``OutboxDispatcher.dispatch_pending()``, in the same run and alternating rounds:

* with: the dispatcher as shipped (an ``OutboxDelivery`` row per message, in the destination's
  transaction);
* without: the send without the check (commit the messages there, nothing else).

It prints records/second (median of the rounds) and the cost of the check. Usage:
``python benchmarks/bench_outbox_delivery.py [--n 1000] [--rounds 6]`` (batch 100 uses 10 x N).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.config import DispatcherSettings
from sqlqueue_orm.models.outbox_delivery import outbox_delivery_table
from sqlqueue_orm.models.queue_table import queue_table
from sqlqueue_orm.sending.dispatcher import OutboxDispatcher
from sqlqueue_orm.sending.outbox import Outbox, OutboxOperation
from sqlqueue_orm.sending.routing import Routing
from testsupport import outbox_app, pg_cluster
from testsupport.databases import admin_engine, new_postgres_database

CHECKED = Outbox._send_remote


def _operation(n: int) -> OutboxOperation:
    message = OutgoingMessage(b'{"n": %d}' % n, message_id=f"m-{n}")
    return OutboxOperation.from_prepared("ledger", message.prepare())


def _run(
    local_url: str, remote_url: str, batch: int, records: int, rounds: int
) -> dict[str, float]:
    local = Transport(local_url)
    outbox_app.install(local)
    remote = Transport(remote_url)
    remote.create_queue("ledger")
    outbox_delivery_table().create(remote.engine, checkfirst=True)
    rates: dict[str, list[float]] = {"without": [], "with": []}
    for round_number in range(rounds):
        sides = ["with", "without"] if round_number % 2 == 0 else ["without", "with"]
        for side in sides:
            Outbox._send_remote = (  # type: ignore[method-assign]
                CHECKED if side == "with" else outbox_app._send_without_check
            )
            with local.engine.begin() as connection:
                connection.execute(sa.text('DELETE FROM "OutboxData"'))
            with remote.engine.begin() as connection:
                connection.execute(sa.delete(queue_table("ledger")))
                connection.execute(sa.delete(outbox_delivery_table()))
            outbox = Outbox(local, Routing({"ledger": remote_url}))
            with local.engine.begin() as connection:
                outbox.store_many(
                    connection,
                    ((f"r-{round_number}-{side}-{n}", [_operation(n)]) for n in range(records)),
                )
            settings = DispatcherSettings(batch_size=batch, grace_period=0)
            dispatcher = OutboxDispatcher(outbox, settings)
            started = time.perf_counter()
            report = dispatcher.dispatch_pending()
            rates[side].append(records / (time.perf_counter() - started))
            assert report.dispatched == records, report
            outbox.close()
    Outbox._send_remote = CHECKED  # type: ignore[method-assign]
    local.close()
    remote.close()
    return {side: statistics.median(values) for side, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    directory = tempfile.mkdtemp()
    admin = admin_engine(pg_cluster.start().url())
    for dialect in ("sqlite", "postgresql"):
        for batch, records in ((1, args.n), (100, 10 * args.n)):
            if dialect == "sqlite":
                urls = (f"sqlite:///{directory}/l{batch}.db", f"sqlite:///{directory}/r{batch}.db")
            else:
                urls = (new_postgres_database(admin), new_postgres_database(admin))
            rates = _run(*urls, batch, records, args.rounds)
            cost = 100 * (1 - rates["with"] / rates["without"])
            print(
                f"{dialect:10} batch {batch:3}: without {rates['without']:6.0f} records/s, "
                f"with {rates['with']:6.0f} records/s, cost {cost:4.1f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
