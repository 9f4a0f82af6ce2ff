"""The ``sqlqueue`` format's options: read on the driver, every bad one refused by name."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import types as T

from sqlqueue_orm import ConfigurationError, headers
from sqlqueue_orm.contrib.spark.options import SinkOptions, SourceOptions

URL = "sqlite:///queues.db"

ROWS = T.StructType(
    [
        T.StructField("order_id", T.StringType()),
        T.StructField("payload", T.StringType()),
        T.StructField("customer", T.StringType()),
    ]
)


def test_the_source_reads_its_options_with_their_defaults() -> None:
    options = SourceOptions.parse({"url": URL, "queue": "audit@[reporting]"})
    assert options == SourceOptions(
        url=URL,
        queue="audit@[reporting]",
        table="audit",
        schema="reporting",
        partitions=4,
        max_rows=None,
        include_body=True,
    )
    given = SourceOptions.parse(
        {
            "url": URL,
            "queue": "audit",
            "partitions": "2",
            "maxRowsPerBatch": "500",
            "includeBody": "FALSE",
        }
    )
    assert (given.partitions, given.max_rows, given.include_body) == (2, 500, False)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"queue": "audit"}, "'url'"),
        ({"url": URL, "queue": ""}, "'queue'"),
        ({"url": "sqlite://", "queue": "audit"}, "in-memory"),
        ({"url": URL, "queue": "audit@[dbo]@[other]"}, "another catalog"),
        ({"url": URL, "queue": "audit", "partitions": "many"}, "'many'"),
        ({"url": URL, "queue": "audit", "maxRowsPerBatch": "0"}, "maxRowsPerBatch"),
        ({"url": URL, "queue": "audit", "includeBody": "yes"}, "'yes'"),
    ],
)
def test_a_bad_source_option_is_refused_by_name(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        SourceOptions.parse(options)


def test_the_sink_reads_its_options_against_the_dataframe() -> None:
    options = SinkOptions.parse(
        {
            "url": URL,
            "queue": "billing",
            "keyColumn": "order_id",
            "bodyColumn": "payload",
            "headers": '{"NServiceBus.EnclosedMessageTypes": "Billing.BillOrder"}',
            "headerColumns": '{"Sales.Customer": "customer"}',
            "batchSize": "50",
        },
        ROWS,
    )
    assert options == SinkOptions(
        url=URL,
        destination="billing",
        key_column="order_id",
        body_column="payload",
        headers=(("NServiceBus.EnclosedMessageTypes", "Billing.BillOrder"),),
        header_columns=(("Sales.Customer", "customer"),),
        batch_size=50,
    )
    # Without a body column each row goes as a JSON object, and says so.
    whole_rows = SinkOptions.parse({"url": URL, "queue": "billing"}, ROWS)
    assert whole_rows.headers == ((headers.CONTENT_TYPE, "application/json"),)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"url": URL, "queue": "billing", "keyColumn": "missing"}, "keyColumn: column 'missing'"),
        ({"url": URL, "queue": "billing", "headerColumns": '{"A": "gone"}'}, "column 'gone'"),
        ({"url": URL, "queue": "billing", "headers": "{not json"}, "'headers' is not JSON"),
        ({"url": URL, "queue": "billing", "headers": '{"A": 1}'}, "JSON object of strings"),
        ({"url": URL, "queue": "billing", "batchSize": "-3"}, "batchSize"),
    ],
)
def test_a_bad_sink_option_is_refused_by_name(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        SinkOptions.parse(options, ROWS)
