"""OutboxDelivery: which outbox messages a database has received from another one's dispatcher.

=============== ========================= ===================== ==================
column          SQL Server                PostgreSQL            SQLite
=============== ========================= ===================== ==================
Destination     nvarchar(200) PK          varchar(200) PK       VARCHAR(200) PK
MessageId       nvarchar(200) PK          varchar(200) PK       VARCHAR(200) PK
OutboxRecordId  nvarchar(200) NOT NULL    varchar(200)          VARCHAR(200)
DeliveredAt     datetime NOT NULL (UTC)   timestamp NOT NULL    DATETIME NOT NULL
=============== ========================= ===================== ==================

The table lives in the *destination's* database. When an outbox dispatcher sends a message to a
queue in another database, it inserts the message and its row here in one transaction on that
database, and looks for the row first: a dispatcher that crashed after that commit but before
marking its own record dispatched finds the row on the next try and does not send the message
again. Index ``ix_OutboxDelivery_DeliveredAt`` serves the cleanup (``DeliveredAt < :cutoff``).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base, table_of

#: Name of the table.
TABLE_NAME = "OutboxDelivery"
#: Longest key part stored as is (nvarchar(200): the two-column key stays within SQL Server's
#: 900-byte limit); longer ones are stored as :func:`delivery_key` shortens them.
MAX_KEY_LENGTH = 200


class DeliveryKey:
    """Mixin of a table recording one delivery per message and destination: its primary key.

    ``(Destination, MessageId)``, each of :data:`MAX_KEY_LENGTH` characters, so the key stays
    within SQL Server's 900-byte limit; its columns come first in the table (``sort_order``), as
    a mixin's otherwise come after the table's own. :class:`OutboxDelivery` and the Spark send
    ledger share it; they are separate tables with separate lifetimes.
    """

    destination: Mapped[str] = mapped_column(
        "Destination", sa.Unicode(MAX_KEY_LENGTH), primary_key=True, sort_order=-1
    )
    message_id: Mapped[str] = mapped_column(
        "MessageId", sa.Unicode(MAX_KEY_LENGTH), primary_key=True, sort_order=-1
    )


class OutboxDelivery(DeliveryKey, Base):
    """One message an outbox dispatcher delivered to a queue in this database."""

    __tablename__ = TABLE_NAME

    outbox_record_id: Mapped[str] = mapped_column(
        "OutboxRecordId", sa.Unicode(MAX_KEY_LENGTH), nullable=False
    )
    delivered_at: Mapped[dt.datetime] = mapped_column(
        "DeliveredAt", sa.DateTime(), nullable=False, index=True
    )

    def __repr__(self) -> str:
        return f"OutboxDelivery(destination={self.destination!r}, message_id={self.message_id!r})"


def delivery_key(text: str) -> str:
    """*text* as a key column holds it: itself up to 200 characters, else a prefix and a hash.

    The SHA-256 of the whole text keeps two long values that share a prefix apart.
    """
    if len(text) <= MAX_KEY_LENGTH:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[: MAX_KEY_LENGTH - len(digest) - 1]}#{digest}"


#: The :class:`~sqlalchemy.Table` of :class:`OutboxDelivery`.
outbox_delivery_table = functools.partial(table_of, OutboxDelivery)
