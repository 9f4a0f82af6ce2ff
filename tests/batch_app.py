"""A batching endpoint for the batched-processing tests, and the crash it can stage.

``python -m tests.batch_app URL MODE BATCH KILL_AT`` runs the ``batched`` endpoint (batches of
BATCH messages, 1: unbatched, in transaction mode MODE, ``default``: left unset); each handler
writes a ``Handled`` row in its session (no unique key: a message handled twice would show) and,
at the KILL_AT-th handler run of the process, SIGKILLs the process: in the middle of a handler,
after its row was flushed, and of a batch, after earlier messages of the same batch were handled
(and, in the outbox mode, their units of work committed).
"""

from __future__ import annotations

import itertools
import os
import signal
import sys

import sqlalchemy as sa

from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.endpoint_app import Handled, Job, UserBase

QUEUE = "batched"


def build(
    transport: Transport, mode: TransactionMode | None, batch: int, kill_at: int = 0
) -> Endpoint:
    """The batching endpoint; *kill_at* > 0: SIGKILL this process at that handler run.

    *mode* ``None``: the default transaction mode, left unset.
    """
    UserBase.metadata.create_all(transport.engine)
    chosen = {} if mode is None else {"transaction_mode": mode}
    settings = EndpointSettings(
        concurrency=2,
        **chosen,  # type: ignore[arg-type]
        peek_delay=0.1,
        batch_size=batch,
        batch_flush=0.05,
        immediate_retries=1,
        delayed_retries=0,
    )
    endpoint = Endpoint(QUEUE, transport, settings=settings)
    runs = itertools.count(1)

    def handle(job: Job, context: HandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id, worker=os.getpid()))
        context.session.flush()
        if next(runs) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    endpoint.handle(Job, handle)
    return endpoint


def main(argv: list[str]) -> None:
    url, mode, batch, kill_at = argv
    engine = sa.create_engine(url) if not url.startswith("sqlite") else None
    transport = Transport(engine or url)
    chosen = None if mode == "default" else TransactionMode(mode)
    endpoint = build(transport, chosen, int(batch), int(kill_at))
    print("started", flush=True)
    endpoint.run()


if __name__ == "__main__":
    # run the module's own copy, so Job is tests.endpoint_app.Job (the name senders write)
    from tests import batch_app

    batch_app.main(sys.argv[1:])
