"""Our hot-path T-SQL beside the .NET SQL Server transport's, statement by statement.

No SQL Server runs here, so the statements are compared as text: the parts that matter for
sharing a queue with .NET endpoints (table and column names, the FIFO order, the lock hints, the
deleted columns a receive outputs, how Expires is computed and tested) must be the same; every
other difference is listed in ``ALLOWED`` with the reason it is harmless, and the test checks that
each listed difference is still real (so the list cannot go stale).

The .NET statements are interop test vectors, written here as the transport runs them:
``src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs`` of
Particular/NServiceBus.SqlServer at commit 214c4e8f06175186e356677546ea2d8e0f2b0c55
(SendTextWithRecoverable, SendTextWithoutRecoverable, ReceiveText, PeekText,
PurgeBatchOfExpiredMessagesText, PurgeText). ``{0}`` is the table's quoted name.
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3

import pytest
import sqlalchemy as sa

from sqlqueue_orm import dialects
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.queuing import sql

_NOCOUNT_BEFORE = """
DECLARE @NOCOUNT VARCHAR(3) = 'OFF';
IF ( (512 & @@OPTIONS) = 512 ) SET @NOCOUNT = 'ON'
SET NOCOUNT ON;
"""
_NOCOUNT_AFTER = """
IF (@NOCOUNT = 'ON') SET NOCOUNT ON;
IF (@NOCOUNT = 'OFF') SET NOCOUNT OFF;"""

DOTNET = {
    "send": _NOCOUNT_BEFORE
    + """
INSERT INTO {0} (
    Id,
    Recoverable,
    Expires,
    Headers,
    Body)
VALUES (
    @Id,
    1,
    CASE WHEN @TimeToBeReceivedMs IS NOT NULL
        THEN DATEADD(ms, @TimeToBeReceivedMs, GETUTCDATE()) END,
    @Headers,
    @Body);
"""
    + _NOCOUNT_AFTER,
    "send_without_recoverable": _NOCOUNT_BEFORE
    + """
INSERT INTO {0} (
    Id,
    Expires,
    Headers,
    Body)
VALUES (
    @Id,
    CASE WHEN @TimeToBeReceivedMs IS NOT NULL
        THEN DATEADD(ms, @TimeToBeReceivedMs, GETUTCDATE()) END,
    @Headers,
    @Body);
"""
    + _NOCOUNT_AFTER,
    "receive": _NOCOUNT_BEFORE.replace("'ON'\n", "'ON';\n")
    + """
WITH message AS (
    SELECT TOP(1) *
    FROM {0} WITH (UPDLOCK, READPAST, ROWLOCK)
    ORDER BY RowVersion)
DELETE FROM message
OUTPUT
    deleted.Id,
    CASE WHEN deleted.Expires IS NULL
        THEN 0
        ELSE CASE WHEN deleted.Expires > GETUTCDATE()
            THEN 0
            ELSE 1
        END
    END,
    deleted.Headers,
    deleted.Body;
"""
    + _NOCOUNT_AFTER,
    "peek": """
SELECT isnull(cast(max([RowVersion]) - min([RowVersion]) + 1 AS int), 0) Id FROM {0} \
WITH (READPAST, READCOMMITTEDLOCK)""",
    "purge_expired": """
DELETE FROM {0}
WHERE RowVersion
    IN (SELECT TOP (@BatchSize) RowVersion
        FROM {0} WITH (READPAST)
        WHERE Expires < GETUTCDATE())""",
    "purge_all": "DELETE FROM {0}",
}

#: (statement, part) -> why the difference is harmless.
ALLOWED = {
    ("send", "wrapper"): "NServiceBus saves, sets and restores NOCOUNT around its batch of "
    "statements; ours is one INSERT, so there are no extra row-count messages to hide",
    ("send_without_recoverable", "wrapper"): "as send",
    ("receive", "wrapper"): "as send: our receive is one statement whose first result is the "
    "OUTPUT rows",
    ("send", "expires"): "both add the TTBR to the database clock, GETUTCDATE(); we add days "
    "and milliseconds apart, because DATEADD(ms, ...) overflows its int past 24.8 days (.NET "
    "binds TimeToBeReceivedMs as Int32, so it never sends more)",
    ("send_without_recoverable", "expires"): "as send",
    ("receive", "top"): "we take up to n rows in one statement (batch receive); TOP(1) is n = 1, "
    "and the rows still leave in RowVersion order under the same hints",
    ("receive", "output"): "we also output deleted.RowVersion (for logging and the batch's "
    "order); the columns .NET reads are all there, in the same order around it",
    ("receive", "expired_flag"): "one flat CASE instead of a nested one: the same value for "
    "every Expires (checked on a real database below)",
    ("peek", "result_type"): "bigint instead of int: the same estimate, and no overflow when "
    "the RowVersion span passes 2^31",
    ("peek", "alias"): "the column alias 'Id' is never read (both read the first column)",
    ("purge_expired", "shape"): "we delete through a CTE, TOP(n) oldest first, with UPDLOCK, "
    "READPAST, ROWLOCK: the receive's lock order, so the purge and receives never deadlock "
    "(NServiceBus.SqlServer #308 came from a purge locking rows in another order); the rows it "
    "deletes are the same kind, Expires < GETUTCDATE(), skipping rows others hold (READPAST)",
    ("purge_expired", "hints"): "as shape: READPAST on both; we add UPDLOCK, ROWLOCK",
    ("purge_expired", "order"): "as shape: oldest expired first",
}


@pytest.fixture(scope="module")
def dialect():
    # The dialect a real mssql+pyodbc engine uses; nothing connects.
    return sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect


ADDRESS = QueueAddress("orders", "sales")


def _ours(dialect, name: str) -> str:
    template = getattr(dialects.mssql.HOT_PATH, name)
    return sql.render(template, dialect, sql.format_table(dialect, ADDRESS)).text


def _theirs(dialect, name: str) -> str:
    return DOTNET[name].replace("{0}", sql.format_table(dialect, ADDRESS))


def _normal(text: str) -> str:
    text = re.sub(r"\[(\w+)\]", r"\1", text)  # [RowVersion] -> RowVersion (names are plain)
    text = re.sub(r"(?<!@)@\w+|\?", ":param", text)  # @BatchSize (ADO.NET), ? (pyodbc)
    return " ".join(text.split())


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


def _output_column(item: str) -> str:
    """The column an OUTPUT item hands back: ``deleted.X``, or a CAST of it (ours reads Headers
    as its UTF-16LE bytes, decoded in Python, so a lone surrogate cannot fail the driver's
    fetch); anything else (the expired CASE) is ``<flag>``."""
    if re.fullmatch(r"deleted\.\w+", item):
        return item.removeprefix("deleted.")
    cast = re.fullmatch(r"(?:CAST\()+deleted\.(\w+)(?: AS [\w()]+\))+", item, re.I)
    return cast.group(1) if cast else "<flag>"


def _parts(text: str) -> dict[str, object]:
    """The parts of a statement that matter for sharing a queue."""
    raw = text
    core = "\n".join(line for line in raw.splitlines() if "NOCOUNT" not in line)
    text = _normal(core)
    found: dict[str, object] = {
        "wrapper": "NOCOUNT" in raw,
        "tables": sorted(set(re.findall(r"(?:FROM|INTO)\s+(sales\.orders)", text))),
    }
    insert = re.search(r"INSERT INTO sales\.orders \((.*?)\) VALUES \((.*)\)", text)
    if insert:
        columns = [column.strip() for column in insert.group(1).split(",")]
        values = _split_top_level(insert.group(2).rstrip(";").rstrip(")"))
        found["columns"] = columns
        values_by_column = dict(zip(columns, values, strict=True))
        found["recoverable"] = values_by_column.get("Recoverable")
        expires = values_by_column["Expires"]
        found["expires_clock"] = "GETUTCDATE()" in expires
        found["expires"] = expires
    hints = re.search(r"FROM sales\.orders WITH \(([^)]*)\)", text)
    if hints:
        found["hints"] = sorted(hint.strip().upper() for hint in hints.group(1).split(","))
    order = re.search(r"ORDER BY (\w+)", text)
    found["order"] = order.group(1) if order else None
    top = re.search(r"TOP\s*\(([^)]*)\)", text)
    found["top"] = top.group(1) if top else None
    output = re.search(r"OUTPUT (.*?);?$", text)
    if output:
        items = _split_top_level(output.group(1).rstrip(";"))
        found["output"] = [_output_column(item) for item in items]
        flags = [item for item in items if item.upper().startswith("CASE")]
        found["expired_flag"] = " ".join(flags)
    where = re.findall(r"WHERE (Expires < GETUTCDATE\(\))", text)
    found["expiry_predicate"] = where[0] if where else None
    peek = re.search(r"SELECT isnull\(cast\((.*?) AS (\w+)\), 0\)\s*(\w*)\s*FROM", text, re.I)
    if peek:
        found["estimate"] = peek.group(1).lower()
        found["result_type"] = peek.group(2).lower()
        found["alias"] = peek.group(3)
    found["shape"] = re.sub(r"\s+", " ", re.sub(r"\(.*\)", "()", text.split(" ")[0])).upper()
    if text.upper().startswith("WITH MESSAGE AS"):
        found["shape"] = "CTE DELETE"
    elif text.upper().startswith("DELETE FROM SALES.ORDERS WHERE"):
        found["shape"] = "DELETE ... IN (subquery)"
    return found


@pytest.mark.parametrize("name", sorted(DOTNET))
def test_statement_matches_dotnet_where_it_matters(dialect, name):
    ours, theirs = _parts(_ours(dialect, name)), _parts(_theirs(dialect, name))
    assert ours.keys() == theirs.keys(), name
    same, allowed_and_different = [], []
    for part in sorted(ours):
        if (name, part) in ALLOWED:
            # Listed as allowed: it must still be a difference (else strike it from the list).
            assert ours[part] != theirs[part], f"{name}.{part} no longer differs: unlist it"
            allowed_and_different.append(part)
        else:
            assert ours[part] == theirs[part], f"{name}.{part}: ours {ours[part]!r}"
            same.append(part)
    # What must match for sharing: never on the allowed list.
    for essential in ("tables", "columns", "recoverable", "expires_clock", "expiry_predicate"):
        assert (name, essential) not in ALLOWED
    if name.startswith("receive"):
        assert ours["order"] == theirs["order"] == "RowVersion"
        assert ours["hints"] == theirs["hints"] == ["READPAST", "ROWLOCK", "UPDLOCK"]
        theirs_output = theirs["output"]
        assert [column for column in ours["output"] if column != "RowVersion"] == theirs_output
        assert theirs_output == ["Id", "<flag>", "Headers", "Body"]
    if name == "peek":
        assert ours["hints"] == theirs["hints"] == ["READCOMMITTEDLOCK", "READPAST"]
        assert ours["estimate"] == theirs["estimate"] == "max(rowversion) - min(rowversion) + 1"
    if name == "purge_expired":
        assert ours["expiry_predicate"] == "Expires < GETUTCDATE()"
        assert "READPAST" in ours["hints"] and "READPAST" in theirs["hints"]


def test_every_allowed_difference_names_a_compared_statement():
    assert {name for name, _ in ALLOWED} <= set(DOTNET)
    assert all(reason.strip() for reason in ALLOWED.values())


def _flag_on_a_real_database(flag: str, expires: dt.datetime | None, now: dt.datetime) -> int:
    expression = _normal(flag).replace("deleted.Expires", ":expires")
    expression = expression.replace("GETUTCDATE()", ":now")
    with sqlite3.connect(":memory:") as connection:
        row = connection.execute(
            f"SELECT {expression}",  # our own test vector: no user input
            {"expires": None if expires is None else expires.isoformat(), "now": now.isoformat()},
        ).fetchone()
    return int(row[0])


def test_expired_flag_has_the_same_value_as_dotnets(dialect):
    ours = _parts(_ours(dialect, "receive"))["expired_flag"]
    theirs = _parts(_theirs(dialect, "receive"))["expired_flag"]
    assert isinstance(ours, str) and isinstance(theirs, str)
    now = dt.datetime(2026, 1, 2, 3, 4, 5)
    second = dt.timedelta(seconds=1)
    for expires, expected in ((None, 0), (now + second, 0), (now, 1), (now - second, 1)):
        assert _flag_on_a_real_database(ours, expires, now) == expected
        assert _flag_on_a_real_database(theirs, expires, now) == expected
