"""The Spark ingest reads the processing headers of the audit copies an endpoint writes."""

from __future__ import annotations

import socket

import pytest

from sqlqueue_orm import OutgoingMessage
from sqlqueue_orm.receiving import Endpoint, EndpointSettings, HandlerContext, TransactionMode
from tests.integration.test_endpoint_transaction_modes import run_until

pytest.importorskip("pyspark")

from sqlqueue_orm.contrib.spark import dataset, ingesting

# Spark's session may start with this test.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def test_spark_ingest_parses_the_audit_headers_an_endpoint_writes(spark, database, tmp_path):
    transport = database.transport()
    transport.create_queue("inbox")
    sent = [transport.send("inbox", OutgoingMessage(b"{}")) for _ in range(3)]
    settings = EndpointSettings(concurrency=1, peek_delay=0.1, audit_queue="audit",
                                transaction_mode=TransactionMode.TRANSACTION_SCOPE)
    endpoint = Endpoint("inbox", transport, settings=settings)

    @endpoint.handle_raw
    def handle(body: bytes, context: HandlerContext) -> None:
        pass

    run_until(endpoint, lambda: endpoint.stats.handled == 3)
    path = str(tmp_path / "audit")
    ingesting.ingest(spark, database.url, "audit", path, batch_size=100)
    rows = dataset.read_dataset(spark, path).collect()
    assert sorted(row["message_id"] for row in rows) == sorted(sent)
    for row in rows:
        assert row["processing_endpoint"] == "inbox"
        assert row["processing_machine"] == socket.gethostname()
        # Spark hands timestamps back in the session's local time zone: compare durations.
        assert row["processing_started"] is not None and row["processing_ended"] is not None
        assert 0 <= row["processing_time_ms"] < 60_000
        assert row["critical_time_ms"] >= row["processing_time_ms"]
        assert row["headers_error"] is None
