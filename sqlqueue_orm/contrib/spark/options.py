"""The ``sqlqueue`` format's options: what its reader and its writer accept, checked once.

``spark.readStream.format("sqlqueue").option(...)`` and ``df.writeStream.format("sqlqueue")``
hand :mod:`~sqlqueue_orm.contrib.spark.streaming` a map of strings; :meth:`SourceOptions.parse`
and :meth:`SinkOptions.parse` read it on the driver into a frozen value that is pickled to the
executors. A bad option is refused there, before any task runs, with one
:class:`~sqlqueue_orm.exceptions.ConfigurationError` naming the first bad option.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from sqlqueue_orm import addressing, exceptions
from sqlqueue_orm import headers as nsb_headers
from sqlqueue_orm.contrib.spark import checks, sending

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

#: Partitions a micro-batch is read in, unless the ``partitions`` option says otherwise.
DEFAULT_PARTITIONS = 4


def _option(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    return None if value is None or value == "" else str(value)


def _required(options: Mapping[str, str], name: str) -> str:
    value = _option(options, name)
    if value is None:
        raise exceptions.ConfigurationError(f"the sqlqueue format needs the option {name!r}")
    return value


def _number(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = _option(options, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise exceptions.ConfigurationError(f"option {name!r} is {text!r}, not a number") from None
    return checks.check_positive(name, value)


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _option(options, name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise exceptions.ConfigurationError(f"option {name!r} is {text!r}; use true or false")
    return text.lower() == "true"


def _json_object(options: Mapping[str, str], name: str) -> dict[str, str]:
    text = _option(options, name)
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise exceptions.ConfigurationError(f"option {name!r} is not JSON: {error}") from None
    if not isinstance(value, dict) or not all(
        isinstance(key, str) and isinstance(item, str) for key, item in value.items()
    ):
        raise exceptions.ConfigurationError(
            f"option {name!r} must be a JSON object of strings, not {text!r}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """What the source needs, from the reader's options (pickled to the executors)."""

    url: str
    queue: str
    table: str
    schema: str | None
    partitions: int
    max_rows: int | None
    include_body: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Read and check the source's options.

        ``url``, ``queue``, ``partitions``, ``maxRowsPerBatch``, ``includeBody``.

        :raises ConfigurationError: naming the first bad option.
        """
        url = _required(options, "url")
        checks.check_url(url)
        address = addressing.QueueAddress.coerce(_required(options, "queue"))
        if address.catalog is not None:
            raise exceptions.ConfigurationError(
                f"queue {str(address)!r} is in another catalog; read it with that database's URL"
            )
        return cls(
            url=url,
            queue=str(address),
            table=address.table,
            schema=address.schema,
            partitions=_number(options, "partitions", DEFAULT_PARTITIONS) or DEFAULT_PARTITIONS,
            max_rows=_number(options, "maxRowsPerBatch", None),
            include_body=_flag(options, "includeBody", True),
        )


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    """What the sink needs, from the writer's options (pickled to the executors)."""

    url: str
    destination: str
    key_column: str | None
    body_column: str | None
    headers: tuple[tuple[str, str], ...]
    header_columns: tuple[tuple[str, str], ...]
    batch_size: int

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        """Read and check the sink's options against the DataFrame's *schema*.

        ``url``, ``queue``, ``keyColumn``, ``bodyColumn``, ``headers``, ``headerColumns``,
        ``batchSize``.

        :raises ConfigurationError: naming the first bad option.
        """
        url = _required(options, "url")
        checks.check_url(url)
        destination = str(addressing.QueueAddress.coerce(_required(options, "queue")))
        columns = set(schema.fieldNames())
        constant = _json_object(options, "headers")
        mapped = _json_object(options, "headerColumns")
        key_column = _option(options, "keyColumn")
        body_column = _option(options, "bodyColumn")
        for what, column in [
            ("keyColumn", key_column),
            ("bodyColumn", body_column),
            *(("headerColumns", value) for value in mapped.values()),
        ]:
            if column is not None and column not in columns:
                raise exceptions.ConfigurationError(
                    f"option {what}: column {column!r} is not in the DataFrame; its columns are "
                    f"{sorted(columns)}"
                )
        if body_column is None or isinstance(
            schema[body_column].dataType, T.StructType | T.MapType | T.ArrayType
        ):
            constant.setdefault(nsb_headers.CONTENT_TYPE, "application/json")  # sent as JSON
        return cls(
            url=url,
            destination=destination,
            key_column=key_column,
            body_column=body_column,
            headers=tuple(constant.items()),
            header_columns=tuple(mapped.items()),
            batch_size=_number(options, "batchSize", sending.SEND_BATCH_SIZE)
            or sending.SEND_BATCH_SIZE,
        )
