"""``send_dataframe``: one message per DataFrame row, exactly once per key with a key column.

Each partition sends in batches of *batch_size* over its own connection, one transaction per
batch. With a *key_column* the NServiceBus.MessageId is ``uuid5(namespace, destination + key)``
and each batch records its message ids in ``SparkSendLedger`` (:mod:`.models`) in the same
transaction as the sends, so a re-run (or a retried task) skips every key already sent: exactly
once per key while its ledger row exists. Without a key column a re-run sends everything again
(at least once).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import sqlalchemy as sa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sqlqueue_orm import db, exceptions
from sqlqueue_orm import headers as nsb_headers
from sqlqueue_orm import transport as transport_module
from sqlqueue_orm.contrib.spark import checks, models, progress, session
from sqlqueue_orm.messages import OutgoingMessage
from sqlqueue_orm.models.base import table_of

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import Column, DataFrame, Row

log = logging.getLogger(__name__)

#: Namespace of keyed message ids: ``uuid5(SEND_NAMESPACE, destination + "\n" + key)``.
SEND_NAMESPACE = uuid.UUID("a3d52c4e-8f0b-5b7e-9d61-3c2f7e1a9b04")

#: Default rows per send transaction of :func:`send_dataframe`.
SEND_BATCH_SIZE = 1_000
_SEND_ATTEMPTS = 5


@dataclasses.dataclass(frozen=True)
class SendResult:
    """What :func:`send_dataframe` did: messages *sent*, rows *skipped* (already in the ledger)."""

    destination: str
    sent: int
    skipped: int


def message_id_for(destination: str, key: str) -> str:
    """The deterministic NServiceBus.MessageId of the row with *key* sent to *destination*."""
    return str(uuid.uuid5(SEND_NAMESPACE, f"{destination}\n{key}"))


@dataclasses.dataclass(frozen=True)
class SendPlan:
    """Everything a send task needs; pickled to the executors."""

    url: str
    destination: str
    default_schema: str | None
    key_column: str | None
    constant_headers: tuple[tuple[str, str], ...]
    header_names: tuple[str, ...]
    batch_size: int


def _quote_column(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def _body_expression(df: DataFrame, body_column: str | None) -> tuple[Column, str | None]:
    """The body as a binary/string column, and the content type it implies."""
    if body_column is None:
        whole_row = F.struct(*[_quote_column(name) for name in df.columns])
        return F.to_json(whole_row), "application/json"
    if body_column not in df.columns:
        raise exceptions.ConfigurationError(
            f"body column {body_column!r} is not in the DataFrame; its columns are {df.columns}"
        )
    data_type = df.schema[body_column].dataType
    column = _quote_column(body_column)
    if isinstance(data_type, T.BinaryType | T.StringType):
        return column, None
    if isinstance(data_type, T.StructType | T.MapType | T.ArrayType):
        return F.to_json(column), "application/json"
    raise exceptions.ConfigurationError(
        f"body column {body_column!r} is {data_type.simpleString()}; use binary, string, or a "
        "struct, map or array (sent as JSON)"
    )


def send_dataframe(
    df: DataFrame,
    destination: str,
    url: str,
    *,
    body_column: str | None = None,
    key_column: str | None = None,
    headers: Mapping[str, str] | None = None,
    header_columns: Mapping[str, str] | None = None,
    batch_size: int = SEND_BATCH_SIZE,
    default_schema: str | None = None,
) -> SendResult:
    r"""Send one message per row of *df* to the queue *destination*.

    Each partition sends over its own connection, in transactions of *batch_size* messages, in
    the NServiceBus wire format. ``NServiceBus.MessageIntent`` (``Send``),
    ``CorrelationId`` (the message id) and ``ConversationId`` are set unless given.

    :param df: the rows.
    :param destination: the queue address (``table@[schema]``); it must exist.
    :param url: the database URL; every Spark task connects with it.
    :param body_column: binary (as is), string (UTF-8) or struct/map/array (JSON, with
        ``NServiceBus.ContentType: application/json``); ``None``: the whole row as JSON.
    :param key_column: a column identifying the row (cast to string, never null). The message id
        becomes ``uuid5(SEND_NAMESPACE, destination + "\n" + key)`` and sends are recorded in
        ``SparkSendLedger``, so a re-run skips keys already sent: exactly once per key while the
        ledger row exists. Without it each run sends every row (at least once).
    :param headers: constant headers of every message.
    :param header_columns: header name -> column; a null value leaves the header out.
    :param batch_size: messages per transaction.
    :param default_schema: schema of a destination that names none.
    :raises ConfigurationError: naming a missing column, a bad header or batch size.
    :raises QueueNotFound: if *destination* does not exist.
    """
    checks.check_url(url)
    checks.check_positive("batch_size", batch_size)
    constant = dict(headers or {})
    for key, value in constant.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise exceptions.ConfigurationError(
                f"header {key!r}: {value!r}: header names and values must be strings"
            )
    mapped = dict(header_columns or {})
    for name, column in mapped.items():
        if column not in df.columns:
            raise exceptions.ConfigurationError(
                f"header {name!r} comes from column {column!r}, which is not in the DataFrame; "
                f"its columns are {df.columns}"
            )
    if key_column is not None:
        if key_column not in df.columns:
            raise exceptions.ConfigurationError(
                f"key column {key_column!r} is not in the DataFrame; its columns are {df.columns}"
            )
        if nsb_headers.MESSAGE_ID in constant or nsb_headers.MESSAGE_ID in mapped:
            raise exceptions.ConfigurationError(
                f"key column {key_column!r} makes the {nsb_headers.MESSAGE_ID} header; do not also "
                "give it as a header"
            )
    body, content_type = _body_expression(df, body_column)
    if content_type is not None:
        constant.setdefault(nsb_headers.CONTENT_TYPE, content_type)

    with transport_module.Transport(url, default_schema=default_schema) as transport:
        address = transport.queues.address(destination)
        checks.require_queue(transport.engine, address)
        if key_column is not None:
            if len(str(address)) > models.MAX_DESTINATION_LENGTH:
                raise exceptions.ConfigurationError(
                    f"destination {str(address)!r} is longer than "
                    f"{models.MAX_DESTINATION_LENGTH} characters, the most the send ledger "
                    "records; send without a key column"
                )
            with db.wrap_db_errors(), transport.engine.begin() as connection:
                ledger_table().create(connection, checkfirst=True)

    plan = SendPlan(
        url=url,
        destination=str(address),
        default_schema=default_schema,
        key_column=key_column,
        constant_headers=tuple(constant.items()),
        header_names=tuple(mapped),
        batch_size=batch_size,
    )
    key_value = (
        _quote_column(key_column).cast("string") if key_column is not None else F.lit(None)
    ).alias("key")
    projected = df.select(
        body.alias("body"),
        key_value,
        *[
            _quote_column(column).cast("string").alias(f"h{i}")
            for i, column in enumerate(mapped.values())
        ],
    )
    partitions = projected.rdd.getNumPartitions()
    log.info("queue %s: sending a message per row over %d partition(s)",
             plan.destination, partitions)
    context = projected.rdd.context
    handled = context.accumulator(0)  # rows sent or skipped, as tasks finish
    with progress.TaskProgress(context, plan.destination, "sending", partitions,
                               counter=handled, unit="row(s)"):
        counts = projected.rdd.mapPartitions(
            functools.partial(_send_partition, plan, handled)
        ).collect()
    sent = sum(item[0] for item in counts)
    skipped = sum(item[1] for item in counts)
    log.info("queue %s: sent %d message(s), skipped %d already sent",
             plan.destination, sent, skipped)
    return SendResult(plan.destination, sent, skipped)


def ledger_table() -> sa.Table:
    """The ledger of the keys sent to each destination (what makes a re-run skip them)."""
    return table_of(models.SparkSendLedger)


def _send_partition(
    plan: SendPlan, handled: Accumulator[int], rows: Iterator[Row]
) -> Iterator[tuple[int, int]]:
    """Send one partition in batches over its own connection; yield (sent, skipped)."""
    engine = session.task_engine(plan.url)
    transport = transport_module.Transport(
        engine, default_schema=plan.default_schema, verify_schema=False
    )
    sent = skipped = 0
    try:
        for batch in session.chunks(rows, plan.batch_size):
            messages = [to_message(plan, row) for row in batch]
            done, already = send_batch(engine, transport, plan, messages)
            sent += done
            skipped += already
            handled.add(done + already)
    finally:
        engine.dispose()
    yield sent, skipped


def to_message(plan: SendPlan, row: Row) -> OutgoingMessage:
    """The message of one (body, key, headers...) row, with its deterministic id."""
    values = dict(plan.constant_headers)
    for name, value in zip(plan.header_names, row[2:], strict=True):
        if value is not None:
            values[name] = value
    if plan.key_column is not None:
        if row[1] is None:
            raise exceptions.InvalidMessage(
                f"queue {plan.destination!r}: key column {plan.key_column!r} is null in a row; "
                "every row needs a key to be sent exactly once"
            )
        message_id = message_id_for(plan.destination, row[1])
    else:
        message_id = values.get(nsb_headers.MESSAGE_ID) or str(uuid.uuid4())
    values[nsb_headers.MESSAGE_ID] = message_id
    values.setdefault(nsb_headers.MESSAGE_INTENT, "Send")
    values.setdefault(nsb_headers.CORRELATION_ID, message_id)
    values.setdefault(nsb_headers.CONVERSATION_ID, str(uuid.uuid4()))
    body = row[0]
    if isinstance(body, bytearray):
        body = bytes(body)
    return OutgoingMessage(body=body, headers=values, message_id=message_id)


def send_batch(
    engine: sa.Engine,
    transport: transport_module.Transport,
    plan: SendPlan,
    messages: list[OutgoingMessage],
) -> tuple[int, int]:
    """Send one batch (and record it in the ledger) in one transaction; retry transient errors."""
    if plan.key_column is None:
        transport.send_many(plan.destination, messages)
        return len(messages), 0
    unique: dict[str, OutgoingMessage] = {}
    for message in messages:
        unique.setdefault(str(message.message_id), message)  # a key twice in the data: once
    ledger = ledger_table()
    for attempt in range(1, _SEND_ATTEMPTS + 1):
        try:
            with engine.begin() as connection:
                sent_before: set[str] = set()
                for chunk in session.chunks(unique, session.IN_CHUNK):
                    sent_before.update(
                        connection.execute(
                            sa.select(ledger.c.MessageId).where(
                                ledger.c.Destination == plan.destination,
                                ledger.c.MessageId.in_(chunk),
                            )
                        ).scalars()
                    )
                todo = [message for key, message in unique.items() if key not in sent_before]
                if todo:
                    transport.send_many(plan.destination, todo, connection=connection)
                    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
                    connection.execute(
                        ledger.insert(),
                        [
                            {"Destination": plan.destination, "MessageId": message.message_id,
                             "SentAt": now}
                            for message in todo
                        ],
                    )
            return len(todo), len(messages) - len(todo)
        except (sa.exc.IntegrityError, sa.exc.OperationalError, exceptions.DatabaseError) as error:
            # A concurrent task (speculative copy, duplicate key elsewhere) recorded some of
            # these first, or a deadlock/lock timeout: the transaction rolled back; look again.
            transient = isinstance(error, sa.exc.IntegrityError) or db.is_transient(error)
            if not transient or attempt == _SEND_ATTEMPTS:
                raise
            log.info("queue %s: send batch failed (%s); retry %d", plan.destination, error, attempt)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover
