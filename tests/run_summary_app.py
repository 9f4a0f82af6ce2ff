"""An endpoint for ``sqlqueue run`` whose failing jobs are retried at once twice, then wait for
a delayed retry an hour away (so a ``--once`` run ends with them waiting)."""

from __future__ import annotations

from sqlqueue_orm import Transport
from sqlqueue_orm.receiving import Endpoint
from tests.endpoint_app import Job


def failing(job: Job, context: object) -> None:
    """Handle *job*: fail when it says so."""
    if job.fail:
        raise ValueError(f"job {job.number} fails")


def endpoint(transport: Transport) -> Endpoint:
    """The endpoint ``sqlqueue run tests.run_summary_app:endpoint`` runs."""
    ep = Endpoint(
        "jobs",
        transport,
        peek_delay=0.1,
        immediate_retries=2,
        delayed_retries=1,
        delayed_retry_increase=3600,
    )
    ep.handle(Job, failing)
    return ep
