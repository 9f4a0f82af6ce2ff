"""An AsyncEndpoint for the asyncio endpoint's crash test, and the crash it stages.

``python -m tests.async_endpoint_app URL KILL_AT`` runs the ``asyncjobs`` endpoint (async
handlers, concurrency 4, TRANSACTION_SCOPE); each handler writes a ``Handled`` row through its
``AsyncSession`` in the receive's transaction (no unique key: a message handled twice would
show) and, at the KILL_AT-th handler run of the process, SIGKILLs the process while other
handlers are in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys

from sqlqueue_orm import Transport
from sqlqueue_orm.aio import AsyncEndpoint, AsyncHandlerContext, AsyncTransport
from tests.endpoint_app import Handled, Job

QUEUE = "asyncjobs"


def build(transport: AsyncTransport, kill_at: int = 0) -> AsyncEndpoint:
    """The endpoint; *kill_at* > 0: SIGKILL this process at that handler run."""
    endpoint = AsyncEndpoint(
        QUEUE, transport, concurrency=4, peek_delay=0.1, immediate_retries=1, delayed_retries=0
    )
    runs = itertools.count(1)

    @endpoint.handle(Job)
    async def handle(job: Job, context: AsyncHandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id, worker=os.getpid()))
        await context.session.flush()
        await asyncio.sleep(0.01)  # others in flight meanwhile
        if next(runs) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    return endpoint


def endpoint(transport: Transport) -> AsyncEndpoint:
    """The endpoint on ``--url``'s database, through its asyncio driver (``sqlqueue run``)."""
    url = transport.engine.url
    url = url.set(drivername=url.get_backend_name())  # the database's asyncio driver
    return build(AsyncTransport(url.render_as_string(hide_password=False)))


async def main(url: str, kill_at: int) -> None:
    """Run the endpoint until it kills itself."""
    async with AsyncTransport(url) as transport:
        await build(transport, kill_at).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
