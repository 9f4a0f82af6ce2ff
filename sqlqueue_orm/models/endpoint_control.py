"""EndpointControl and ControlAction: live control of running endpoints, and who changed it.

``sqlqueue_endpoint_control``, one row per controlled endpoint:

============ ========================= ===================== ==================
column       SQL Server                PostgreSQL            SQLite
============ ========================= ===================== ==================
endpoint     nvarchar(450) PK          varchar(450) PK       VARCHAR(450) PK
paused       bit NOT NULL              boolean NOT NULL      BOOLEAN NOT NULL
concurrency  int NULL                  integer NULL          INTEGER NULL
changed_at   datetime NOT NULL (UTC)   timestamp NOT NULL    DATETIME NOT NULL
changed_by   nvarchar(400) NOT NULL    varchar(400)          VARCHAR(400)
============ ========================= ===================== ==================

``sqlqueue_control_log``, one row per change made through :mod:`sqlqueue_orm.control`:

============ ========================= ===================== ==================
column       SQL Server                PostgreSQL            SQLite
============ ========================= ===================== ==================
id           bigint IDENTITY PK        bigserial PK          INTEGER PK
endpoint     nvarchar(450) NOT NULL    varchar(450)          VARCHAR(450)
action       nvarchar(100) NOT NULL    varchar(100)          VARCHAR(100)
at           datetime NOT NULL (UTC)   timestamp NOT NULL    DATETIME NOT NULL
host         nvarchar(255) NOT NULL    varchar(255)          VARCHAR(255)
os_user      nvarchar(255) NOT NULL    varchar(255)          VARCHAR(255)
client       nvarchar(255) NULL        varchar(255) NULL     VARCHAR(255) NULL
============ ========================= ===================== ==================

Every running process of an endpoint reads its control row by its primary key about twice a
second (:mod:`sqlqueue_orm.receiving.control`), so the read costs the same however many
endpoints there are. ``concurrency`` NULL means the endpoint's configured concurrency. The log is
read newest first per endpoint (index ``ix_sqlqueue_control_log_endpoint``). An endpoint that
creates its queues creates the control table at start-up when missing, and the control API
creates both tables on first use; revision ``0015_endpoint_control`` creates them for databases
migrated with Alembic.
"""

from __future__ import annotations

import datetime as dt
import functools

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from sqlqueue_orm.models.base import Base, table_of

#: Name of the control table.
TABLE_NAME = "sqlqueue_endpoint_control"
#: Name of the action log.
LOG_TABLE_NAME = "sqlqueue_control_log"
#: Longest endpoint name stored (nvarchar(450): 900 bytes, SQL Server's key limit).
NAME_LENGTH = 450
#: Longest host, user or client address stored (longer ones are cut).
WHO_LENGTH = 255
#: Longest ``changed_by`` stored.
CHANGED_BY_LENGTH = 400
#: Longest action text stored.
ACTION_LENGTH = 100

#: Log ids: BIGINT, but SQLite only autoincrements a column typed exactly INTEGER.
LOG_ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class EndpointControl(Base):
    """The operator's control of one endpoint: paused, and a concurrency override."""

    __tablename__ = TABLE_NAME

    endpoint: Mapped[str] = mapped_column(sa.Unicode(NAME_LENGTH), primary_key=True)
    paused: Mapped[bool] = mapped_column(sa.Boolean(), nullable=False)
    concurrency: Mapped[int | None] = mapped_column(sa.Integer(), nullable=True)
    changed_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(), nullable=False)
    changed_by: Mapped[str] = mapped_column(sa.Unicode(CHANGED_BY_LENGTH), nullable=False)

    def __repr__(self) -> str:
        return (
            f"EndpointControl(endpoint={self.endpoint!r}, paused={self.paused!r}, "
            f"concurrency={self.concurrency!r})"
        )


class ControlAction(Base):
    """One change of an endpoint's control: what, when and by whom."""

    __tablename__ = LOG_TABLE_NAME

    id: Mapped[int] = mapped_column(LOG_ID_TYPE, primary_key=True, autoincrement=True)
    endpoint: Mapped[str] = mapped_column(sa.Unicode(NAME_LENGTH), nullable=False, index=True)
    action: Mapped[str] = mapped_column(sa.Unicode(ACTION_LENGTH), nullable=False)
    at: Mapped[dt.datetime] = mapped_column(sa.DateTime(), nullable=False)
    host: Mapped[str] = mapped_column(sa.Unicode(WHO_LENGTH), nullable=False)
    os_user: Mapped[str] = mapped_column(sa.Unicode(WHO_LENGTH), nullable=False)
    client: Mapped[str | None] = mapped_column(sa.Unicode(WHO_LENGTH), nullable=True)

    def __repr__(self) -> str:
        return f"ControlAction(endpoint={self.endpoint!r}, action={self.action!r}, at={self.at!r})"


#: The :class:`~sqlalchemy.Table` of :class:`EndpointControl`.
control_table = functools.partial(table_of, EndpointControl)
#: The :class:`~sqlalchemy.Table` of :class:`ControlAction`.
log_table = functools.partial(table_of, ControlAction)
