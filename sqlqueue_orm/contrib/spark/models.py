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
from sqlqueue_orm.models.outbox_delivery import MAX_KEY_LENGTH, DeliveryKey

#: Name of the table.
TABLE_NAME = "SparkSendLedger"
#: Longest destination address the ledger can record (its key is the outbox delivery table's).
MAX_DESTINATION_LENGTH = MAX_KEY_LENGTH


class SparkSendLedger(DeliveryKey, Base):
    """One message ``send_dataframe`` sent from a keyed row."""

    __tablename__ = TABLE_NAME

    sent_at: Mapped[dt.datetime] = mapped_column(
        "SentAt", sa.DateTime(), nullable=False, index=True
    )
