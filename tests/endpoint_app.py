"""A user's endpoint application for the endpoint tests, the CLI test and the SIGTERM test.

``python -m tests.endpoint_app URL QUEUE MODE CONCURRENCY HANDLE_SECONDS SHUTDOWN_TIMEOUT
[RECORD]`` runs an endpoint on QUEUE until SIGTERM; each handler writes a ``Handled`` row
(message id, process id) in its session, sleeps HANDLE_SECONDS and prints ``handling <id>``
first, so a test knows when a message is in flight; the endpoint's control lines
(``queue QUEUE: paused``) are printed too. With RECORD, each handler appends a ``start T`` line
to that file as it begins and an ``end T`` line as it ends (T: ``time.monotonic()``, one clock
for every process of the machine), so a test can count the handlers that overlapped.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import pydantic
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlqueue_orm import OutgoingMessage, Transport
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode


class UserBase(DeclarativeBase):
    pass


class Handled(UserBase):
    """One row per handling of a message (no unique key: duplicates would show)."""

    __tablename__ = "handled"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(sa.String(200))
    worker: Mapped[int] = mapped_column(default=0)


class Job(pydantic.BaseModel):
    """The message the test endpoints handle."""

    number: int
    fail: bool = False


class Note(pydantic.BaseModel):
    """What a Job handler sends."""

    number: int


def handled_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(sa.select(Handled.message_id)).scalars())


class Meter:
    """Counts handlers running at once, measured by the handlers themselves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def __enter__(self) -> Meter:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self.lock:
            self.now -= 1


def endpoint(transport: Transport) -> Endpoint:
    """The factory ``sqlqueue run tests.endpoint_app:endpoint`` uses: an empty Job handler."""
    ep = Endpoint("jobs", transport, peek_delay=0.1)
    ep.handle(Job, lambda job, context: None)
    return ep


def main(argv: list[str]) -> None:
    url, queue, mode, concurrency, seconds, shutdown, *record = argv
    engine = sa.create_engine(url) if not url.startswith("sqlite") else None
    transport = Transport(engine or url)
    UserBase.metadata.create_all(transport.engine)
    settings = EndpointSettings(
        concurrency=int(concurrency),
        transaction_mode=TransactionMode(mode),
        peek_delay=0.1,
        shutdown_timeout=float(shutdown),
    )
    ep = Endpoint(queue, transport, settings=settings)

    def handle(job: Job, context: HandlerContext) -> None:
        _record(record, "start")
        # one write with its newline: print's separate one for ``end`` lets another thread's
        # line (a control line) land in the middle, where a test waiting for it misses it
        print(f"handling {context.message_id}\n", end="", flush=True)
        context.session.add(Handled(message_id=context.message_id, worker=os.getpid()))
        time.sleep(float(seconds))
        _record(record, "end")

    ep.handle(Job, handle)
    # the endpoint's control lines ("queue jobs: paused ...") on stdout, for tests to wait on
    control_log = logging.getLogger("sqlqueue_orm.receiving.control")
    control_log.setLevel(logging.INFO)
    control_log.addHandler(logging.StreamHandler(sys.stdout))
    print("started", flush=True)
    ep.run()
    print("stopped", flush=True)


def _record(record: list[str], event: str) -> None:
    """Append *event* with the time to the RECORD file, if given (one short line: one write)."""
    if record:
        with open(record[0], "a", encoding="utf-8") as file:
            file.write(f"{event} {time.monotonic()!r}\n")


def send_jobs(transport: Transport, queue: str, count: int) -> list[str]:
    return transport.send_many(queue, [OutgoingMessage(Job(number=n)) for n in range(count)])


if __name__ == "__main__":
    # run the module's own copy, so Job is tests.endpoint_app.Job (the name senders write)
    from tests import endpoint_app

    endpoint_app.main(sys.argv[1:])
