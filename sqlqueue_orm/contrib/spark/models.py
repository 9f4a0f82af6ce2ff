"""``SparkSendLedger``: the keyed messages ``send_dataframe`` has sent, per destination.

=============== ========================= ===================== ==================
column          SQL Server                PostgreSQL            SQLite
=============== ========================= ===================== ==================
Destination     nvarchar(200) PK          varchar(200) PK       VARCHAR(200) PK
MessageId       nvarchar(200) PK          varchar(200) PK       VARCHAR(200) PK
SentAt          datetime NOT NULL (UTC)   timestamp NOT NULL    DATETIME NOT NULL
=============== ========================= ===================== ==================

A row is inserted in the same transaction as the message it records, in the destination's
database, so a row exists exactly when its message was sent. Index ``ix_SparkSendLedger_SentAt``
serves pruning (``DELETE ... WHERE SentAt < :cutoff``): a pruned key is sent again on a re-run.

The model lives in contrib (the core never imports contrib) but on the core's
:data:`~sqlqueue_orm.models.Base.metadata`: Alembic's environment imports this module by name
(:data:`sqlqueue_orm.migration.configuration.MODEL_MODULES`), so ``alembic check`` and autogenerate
compare it with what revision ``0006_spark_send_ledger`` created. No PySpark is imported here.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base

#: Name of the table.
TABLE_NAME = "SparkSendLedger"
#: Longest destination address the ledger can record (nvarchar(200): the two-column key stays
#: within SQL Server's 900-byte limit).
MAX_DESTINATION_LENGTH = 200


class SparkSendLedger(Base):
    """One message ``send_dataframe`` sent from a keyed row."""

    # The same (Destination, key) layout as OutboxDelivery on purpose: both record one delivery
    # per key and destination, within SQL Server's 900-byte key; they are separate tables with
    # separate lifetimes.

    __tablename__ = TABLE_NAME

    destination: Mapped[str] = mapped_column(
        "Destination", sa.Unicode(MAX_DESTINATION_LENGTH), primary_key=True
    )
    message_id: Mapped[str] = mapped_column("MessageId", sa.Unicode(200), primary_key=True)
    sent_at: Mapped[dt.datetime] = mapped_column(
        "SentAt", sa.DateTime(), nullable=False, index=True
    )
