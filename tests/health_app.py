"""An endpoint that beats every 0.2 s, for the health tests that kill its process.

``python -m tests.health_app URL QUEUE`` runs an endpoint on QUEUE (heartbeats every 0.2 s,
metrics every 0.2 s) and prints ``started`` once it runs; it handles Job messages doing nothing.
"""

from __future__ import annotations

import sys

from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint, HandlerContext

#: The interval the tests wait on: stale after three missed beats.
BEAT = 0.2


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
