"""Endpoints that beat every 0.2 s, for the health tests that kill or signal their process.

``python -m tests.health_app URL QUEUE`` runs an endpoint on QUEUE (heartbeats every 0.2 s,
metrics every 0.2 s) and prints ``started`` once it runs; it handles Job messages doing nothing.

``sqlqueue run tests.health_app:beating`` runs the endpoint ``beating``: heartbeats every 0.2 s,
samples at the default interval (so the samples of a short run are the first and the last);
each Job's handler writes a ``Handled`` row; one with a ``number`` prints ``handling`` and
sleeps ``number`` milliseconds.
"""

from __future__ import annotations

import sys
import time

from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext

#: The interval the tests wait on: stale after three missed beats.
BEAT = 0.2

#: An endpoint of the in-process health tests: it beats and samples every BEAT, two handlers
#: at once, no retries.
BEATING = EndpointSettings(
    peek_delay=0.1,
    concurrency=2,
    immediate_retries=0,
    delayed_retries=0,
    heartbeat_interval=BEAT,
    metrics_interval=BEAT,
)


def beating(transport: Transport) -> Endpoint:
    """The endpoint ``beating`` (module docstring), for ``sqlqueue run``."""
    from tests.endpoint_app import Handled, Job, UserBase

    UserBase.metadata.create_all(transport.engine)
    endpoint = Endpoint("beating", transport, peek_delay=0.1, heartbeat_interval=BEAT)

    def handle(job: Job, context: HandlerContext) -> None:
        context.session.add(Handled(message_id=context.message_id))
        if job.number:
            print("handling", flush=True)
            time.sleep(job.number / 1000)

    endpoint.handle(Job, handle)
    return endpoint


def main(argv: list[str]) -> None:
    from tests.endpoint_app import Job

    url, queue = argv
    transport = Transport(url)
    endpoint = Endpoint(
        queue, transport, peek_delay=0.1, heartbeat_interval=BEAT, metrics_interval=BEAT
    )

    def handle(job: Job, context: HandlerContext) -> None:
        pass

    endpoint.handle(Job, handle)
    endpoint.start()
    print("started", flush=True)
    endpoint.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
