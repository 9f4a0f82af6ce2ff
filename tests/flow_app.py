"""An endpoint for the flow-control tests, run in several processes at once.

``python -m tests.flow_app URL QUEUE CONCURRENCY SETTINGS_JSON SLEEP`` runs an endpoint on QUEUE
(TRANSACTION_SCOPE, CONCURRENCY workers, the flow-control settings SETTINGS_JSON) until
SIGTERM. Each handler records when it ran (``Span``: start and end, wall clock, in its session,
so the row commits with the receive) and sleeps SLEEP seconds (ten times longer for the key
``slow``, the header ``customer``).
"""

from __future__ import annotations

import json
import sys
import time

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.endpoint_app import Job


class FlowBase(DeclarativeBase):
    pass


class Span(FlowBase):
    """One handler run: which message, of which key, from when to when."""

    __tablename__ = "spans"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(sa.String(200))
    key: Mapped[str] = mapped_column(sa.String(200), default="")
    number: Mapped[int] = mapped_column(default=0)
    started: Mapped[float]
    ended: Mapped[float]


def spans(engine: sa.Engine) -> list[Span]:
    """Every recorded run, by start."""
    with engine.connect() as connection:
        return list(connection.execute(sa.select(Span).order_by(Span.started)).all())  # type: ignore[arg-type]


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals overlapping at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    now = peak = 0
    for _, step in events:  # an end before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


def build(transport: Transport, queue: str, concurrency: int, flow: dict[str, object],
          sleep: float) -> Endpoint:
    FlowBase.metadata.create_all(transport.engine)
    settings = EndpointSettings(
        concurrency=concurrency,
        transaction_mode=TransactionMode.TRANSACTION_SCOPE,
        peek_delay=0.1,
        delayed_delivery=False,
        **flow,  # type: ignore[arg-type]
    )
    endpoint = Endpoint(queue, transport, settings=settings)

    def handle(job: Job, context: HandlerContext) -> None:
        started = time.time()
        key = context.headers.get("customer") or ""
        time.sleep(sleep * (10 if key == "slow" else 1))
        context.session.add(Span(
            message_id=context.message_id, key=key,
            number=job.number, started=started, ended=time.time(),
        ))

    endpoint.handle(Job, handle)
    return endpoint


def main(argv: list[str]) -> None:
    url, queue, concurrency, flow, sleep = argv
    transport = Transport(sa.create_engine(url) if not url.startswith("sqlite") else url)
    endpoint = build(transport, queue, int(concurrency), json.loads(flow), float(sleep))
    print("started", flush=True)
    endpoint.run()


if __name__ == "__main__":
    from tests import flow_app

    flow_app.main(sys.argv[1:])
