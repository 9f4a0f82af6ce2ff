"""The demo: the main job of sqlqueue_orm on an embedded SQLite database, start to finish.

Run ``python -m sqlqueue_orm.demo [--url URL] [--dir DIR]``. It creates queues, sends inside a
business transaction (and shows a rolled-back one leaving nothing), lets three competing
consumers share a queue's messages with each handled exactly once, shows TTBR expiry and the
estimated peek, fills the audit and error queues the Spark report reads (no Spark needed), lists
the queues, and ends with the SQL Server DDL a DBA would review and a one-line summary. Every
step runs every time; nothing depends on what else is installed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.cli import ddl_dialect
from sqlqueue_orm.schema import QueueInstaller

log = logging.getLogger("sqlqueue_orm.demo")


#: The competing consumers of the demo's queue.
CONSUMERS = 3
#: Messages one consumer takes per transaction.
CONSUMER_BATCH = 5
#: The time a consumer spends on one message it took (its handler's work).
HANDLING_SECONDS = 0.001


def _step(title: str) -> None:
    print(f"\n== {title}")


def run(url: str, messages: int = 300, audit_messages: int = 20_000) -> dict[str, int]:
    """Run the demo against *url*; return the figures it printed (for the tests)."""
    figures: dict[str, int] = {}
    with Transport(url) as transport:
        _step("create queues (idempotent; safe when several processes start at once)")
        for name in ("billing", "shipping"):
            print(f"  {name}: {'created' if transport.create_queue(name) else 'exists'}")
            transport.purge_all(name)

        _step("send inside your own transaction: commits with your data, or not at all")
        metadata = sa.MetaData()
        orders = sa.Table(
            "demo_orders",
            metadata,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("customer", sa.String(100)),
        )
        metadata.create_all(transport.engine)
        with transport.engine.begin() as connection:
            connection.execute(orders.delete())
            connection.execute(orders.insert(), {"id": 1, "customer": "Ada"})
            transport.send(
                "billing",
                OutgoingMessage(b'{"order": 1}', headers={"NServiceBus.EnclosedMessageTypes":
                                                          "Demo.OrderPlaced"}),
                connection=connection,
            )
        try:
            with transport.engine.begin() as connection:
                connection.execute(orders.insert(), {"id": 2, "customer": "Bob"})
                transport.send("billing", OutgoingMessage(b'{"order": 2}'), connection=connection)
                raise RuntimeError("payment declined")
        except RuntimeError as error:
            print(f"  order 2 rolled back ({error}): its message is gone with it")
        figures["billing"] = transport.peek("billing")
        print(f"  billing holds {figures['billing']} message (order 1 only)")

        _step(f"{messages} messages, three competing consumers, each handled exactly once")
        transport.send_many(
            "shipping",
            [OutgoingMessage(f"parcel {i}", message_id=f"parcel-{i}") for i in range(messages)],
        )
        print(f"  peek (estimated count, same cost at any size): {transport.peek('shipping')}")
        handled: Counter[str] = Counter()
        by_consumer: Counter[str] = Counter()
        lock = threading.Lock()
        start_together = threading.Barrier(CONSUMERS)

        def consume(name: str) -> None:
            # Started together, each takes a few messages per transaction and handles them
            # after its commit, as an endpoint does; meanwhile the others take the next ones.
            start_together.wait()
            while True:
                with transport.engine.begin() as connection:
                    batch = transport.receive("shipping", CONSUMER_BATCH, connection=connection)
                if not batch:
                    return
                time.sleep(HANDLING_SECONDS * len(batch))
                with lock:
                    handled.update(message.message_id for message in batch)
                    by_consumer[name] += len(batch)

        names = [f"consumer-{n}" for n in range(CONSUMERS)]
        threads = [threading.Thread(target=consume, args=(name,)) for name in names]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        figures["handled"] = len(handled)
        figures["duplicates"] = sum(count - 1 for count in handled.values())
        shares = {name: by_consumer[name] for name in names}
        figures["idle_consumers"] = sum(1 for count in shares.values() if not count)
        print(f"  handled {len(handled)} distinct messages, {figures['duplicates']} duplicates, "
              f"in {elapsed:.2f}s; per consumer: {shares}")

        _step("time to be received: expired messages are never handed out as live")
        transport.send("billing", OutgoingMessage(b"stale quote", time_to_be_received=0.2))
        time.sleep(0.4)
        received = transport.receive("billing", 10)
        for message in received:
            print(f"  {message.text!r}: {'expired, discard' if message.expired else 'live'}")
        figures["expired"] = sum(1 for message in received if message.expired)

        _step("the audit and error queues NServiceBus endpoints write (input of the Spark report)")
        from sqlqueue_orm.contrib.spark.sample import fill_sample_queues  # no Spark needed

        for name in ("audit", "error"):  # a re-run starts from empty queues
            transport.create_queue(name)
            transport.purge_all(name)
        audited, failed = fill_sample_queues(
            transport, count=audit_messages, start=dt.datetime(2025, 3, 4, 9, 0),
            span=dt.timedelta(hours=2),
        )
        figures["audit"], figures["error"] = len(audited), len(failed)
        print(f"  audit: {len(audited)} processed messages, error: {len(failed)} failed ones "
              "(report them: see docs/spark.md)")

        _step("queues and estimated counts")
        for name, count in transport.list_queues():
            print(f"  {name}\t{count}")

    _step("the DDL a DBA reviews (SQL Server 2019+)")
    for statement in QueueInstaller().ddl(QueueAddress("billing", "dbo"), ddl_dialect("mssql")):
        print("  " + statement.replace("\n", "\n  ") + "\n  GO")
    return figures


def summary(figures: dict[str, int], consumers: int) -> str:
    """The demo's figures in one line, each named by the step that produced it."""
    plural = "" if figures["billing"] == 1 else "s"
    return (
        f"billing held {figures['billing']} message{plural} after the rolled-back order; "
        f"{figures['handled']} handled by {consumers} consumers, "
        f"{figures['duplicates']} duplicates, {figures['idle_consumers']} idle; "
        f"{figures['expired']} expired; audit {figures['audit']}, error {figures['error']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo from the command line."""
    parser = argparse.ArgumentParser(prog="python -m sqlqueue_orm.demo", description=__doc__)
    parser.add_argument("--dir", default="demo-output", help="where the SQLite file goes")
    parser.add_argument("--url", help="database URL (default: SQLite in --dir)")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--audit-messages", type=int, default=20_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.makedirs(args.dir, exist_ok=True)
    url = args.url or f"sqlite:///{os.path.join(args.dir, 'demo.db')}"
    print(f"sqlqueue_orm demo on {url}")
    figures = run(url, args.messages, args.audit_messages)
    ok = figures["handled"] == args.messages and figures["duplicates"] == 0
    print(f"\ndemo {'OK' if ok else 'FAILED'}: {summary(figures, CONSUMERS)}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
