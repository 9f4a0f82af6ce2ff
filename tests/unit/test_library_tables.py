"""Which tables ``sqlqueue_orm.alembic_filter`` leaves out of an application's autogenerate.

The column layouts of every dialect, SQL Server's included (no server runs here): the same
judgement runs on SQLite and PostgreSQL in tests/migration/test_application_alembic.py.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import sqlqueue_orm
from sqlqueue_orm.migration import ownership

LIBRARY = [
    # queue tables, in the SQL Server / SQLite layout (with and without the legacy columns)
    ("billing", ["Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "Headers",
                 "Body", "RowVersion"]),
    ("any name at all", ["Id", "Expires", "Headers", "Body", "RowVersion", "BodyString"]),
    # NServiceBus's PostgreSQL layout
    ("billing", ["id", "expires", "headers", "body", "seq", "bodystring"]),
    # delayed tables
    ("billing.Delayed", ["Headers", "Body", "Due", "RowVersion"]),
    ("billing.Delayed", ["id", "headers", "body", "due"]),
    # subscription tables under a configured name
    ("Subscriptions", ["QueueAddress", "Endpoint", "Topic"]),
    ("subscriptions", ["queueaddress", "endpoint", "topic"]),
    # shared tables and the version table, by name
    ("OutboxData", ["MessageId"]),
    ("SparkSendLedger", ["Key"]),
    ("sqlqueue_endpoint_control", ["endpoint"]),
    ("sqlqueue_alembic_version", ["version_num"]),
]  # fmt: skip

APPLICATION = [
    ("customers", ["id", "name"]),
    ("orders", ["id", "expires", "body"]),  # a queue's columns in part
    ("audit", ["QueueAddress", "Endpoint", "Topic", "Note"]),  # more than a subscription table
    ("alembic_version", ["version_num"]),
]


@pytest.mark.parametrize(("name", "columns"), LIBRARY)
def test_the_librarys_tables_are_left_out(name: str, columns: list[str]) -> None:
    assert ownership.is_library_table(name, columns)
    table = sa.Table(name, sa.MetaData(), *(sa.Column(column, sa.Integer) for column in columns))
    assert sqlqueue_orm.alembic_filter(table, name, "table", True, None) is False
    assert sqlqueue_orm.alembic_filter(table, name, "table", False, None) is False


@pytest.mark.parametrize(("name", "columns"), APPLICATION)
def test_the_applications_tables_are_compared(name: str, columns: list[str]) -> None:
    assert not ownership.is_library_table(name, columns)
    table = sa.Table(name, sa.MetaData(), *(sa.Column(column, sa.Integer) for column in columns))
    assert sqlqueue_orm.alembic_filter(table, name, "table", True, None) is True


def test_what_a_table_holds_is_left_to_the_tables_judgement() -> None:
    index = sa.Index("ix", sa.Column("Expires", sa.Integer))
    assert sqlqueue_orm.alembic_filter(index, "ix", "index", True, None) is True
