"""SQLite: after ``sqlqueue migrate`` a queue table of any era passes ``sqlqueue verify``.

Tables made by an older version or by hand differ in what SQLite ignores: the declared length
of a text column (``Id VARCHAR(36)`` where this version declares ``CHAR(32)``: SQLite enforces
no length, and the ids written are 32 hex digits either way) and a missing ``NOT NULL`` on
``RowVersion INTEGER PRIMARY KEY`` (the rowid, never NULL). The migration leaves both as they
are, and ``verify`` accepts them; a difference the migration repairs (the Headers type, a
missing index) is still reported before it runs.
"""

from __future__ import annotations

import pytest

from sqlqueue_orm import OutgoingMessage, cli
from tests.conftest import Database, only
from testsupport import legacy

QUEUE = "orders v1"

#: A v1-era table as written by hand or an older tool: ids as 36-character text, RowVersion
#: the rowid without NOT NULL, VARCHAR headers, no Expires index, no AUTOINCREMENT.
HAND_MADE = (
    f'CREATE TABLE "{QUEUE}" ("Id" VARCHAR(36) NOT NULL, "CorrelationId" VARCHAR(255), '
    '"ReplyToAddress" VARCHAR(255), "Recoverable" BOOLEAN NOT NULL, "Expires" DATETIME, '
    '"Headers" VARCHAR NOT NULL, "Body" BLOB, "RowVersion" INTEGER PRIMARY KEY)'
)


def _v1_from_legacy(database: Database) -> list[str]:
    return legacy.v1_sqlite(legacy.Names(database.engine.dialect, QUEUE, None))


@only("sqlite")
@pytest.mark.parametrize("era", ["hand-made", "v1"])
def test_verify_finds_no_drift_after_migrate(database, era):
    statements = [HAND_MADE] if era == "hand-made" else _v1_from_legacy(database)
    with database.engine.begin() as connection:
        for statement in statements:
            connection.exec_driver_sql(statement)
    database.transport().send(QUEUE, OutgoingMessage(b"kept"))
    url = database.url
    assert cli.main(["--url", url, "verify"]) == 1  # Headers type, Expires index
    assert cli.main(["--url", url, "migrate"]) == 0
    assert cli.main(["--url", url, "verify"]) == 0
    assert [message.body for message in database.transport().receive(QUEUE)] == [b"kept"]
