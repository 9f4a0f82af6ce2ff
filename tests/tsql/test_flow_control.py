"""Golden tests: the T-SQL of flow control (slot claims, the rate reservation, revision 0012).

No SQL Server runs here, so the text compiled by the mssql+pyodbc dialect is the contract.
"""


import sqlalchemy as sa

from sqlqueue_orm import dialects
from sqlqueue_orm.queuing import sql
from sqlqueue_orm.receiving.flow import rate_limit
from tests.tsql.offline import revision_statements

#: SQL Server's flow statements, as its dialect module holds them.
FLOW = dialects.for_dialect("mssql").flow
assert FLOW is not None


def test_the_slot_claim():
    dialect = sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect
    compiled = sa.text(FLOW.claim_slot).compile(dialect=dialect)
    assert str(compiled) == (
        "SET NOCOUNT ON; "
        "DECLARE @k int = ?, @first int = ?, @slot int = 0, @result int, "
        "@resource nvarchar(255), "
        "@base nvarchar(64) = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
        "CAST(? AS nvarchar(4000))), 2); "
        "WHILE @slot < @k BEGIN "
        "SET @resource = N'sqlqueue.slots.' + @base + N'.' "
        "+ CAST((@slot + @first) % @k AS nvarchar(10)); "
        "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Transaction', @LockTimeout = 0; "
        "IF @result >= 0 BREAK; "
        "SET @slot += 1; "
        "END; "
        "SELECT CASE WHEN @slot < @k THEN (@slot + @first) % @k ELSE -1 END;"
    )
    assert compiled.positiontup == ["k", "first", "name"]


def test_the_claim_of_several_slots_in_one_batch():
    """The per-key receive's optimistic path: key slots and the global slot, one round trip.

    Same resource names as the single claim (``sqlqueue.slots.`` + SHA-256 of the lock name
    + ``.`` + slot), so both paths count the same slots.
    """
    dialect = sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect
    compiled = sa.text(FLOW.claim_slots).compile(dialect=dialect)
    assert str(compiled) == (
        "SET NOCOUNT ON; "
        "DECLARE @first int = ?, @i int = 0, @n int, @k int, @slot int, @result int, "
        "@name nvarchar(max), @base nvarchar(64), @resource nvarchar(255); "
        "DECLARE @wanted TABLE (i int PRIMARY KEY, name nvarchar(max), k int); "
        "INSERT INTO @wanted (i, name, k) SELECT i, name, k "
        "FROM OPENJSON(CAST(? AS nvarchar(max))) "
        "WITH (name nvarchar(max) '$[0]', k int '$[1]', i int '$[2]'); "
        "SELECT @n = COUNT(*) FROM @wanted; "
        "WHILE @i < @n BEGIN "
        "SELECT @name = name, @k = k FROM @wanted WHERE i = @i; "
        "SET @base = CONVERT(nvarchar(64), HASHBYTES('SHA2_256', "
        "CAST(@name AS nvarchar(4000))), 2); "
        "SET @slot = 0; SET @result = -1; "
        "WHILE @slot < @k AND @result < 0 BEGIN "
        "SET @resource = N'sqlqueue.slots.' + @base + N'.' "
        "+ CAST((@slot + @first) % @k AS nvarchar(10)); "
        "EXEC @result = sp_getapplock @Resource = @resource, @LockMode = 'Exclusive', "
        "@LockOwner = 'Transaction', @LockTimeout = 0; "
        "SET @slot += 1; "
        "END; "
        "IF @result < 0 BREAK; "
        "SET @i += 1; "
        "END; "
        "SELECT @i;"
    )
    assert compiled.positiontup == ["first", "claims"]
    # as pyodbc gets it: rendered for the qmark style, the modulo left as it is
    rendered = sql.render(FLOW.claim_slots, dialect, "")
    assert rendered.names == ("first", "claims") and "% @k" in rendered.text


def test_the_rate_limit_reservation():
    dialect = sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect
    statement = FLOW.reserve.format(
        table=dialect.identifier_preparer.format_table(rate_limit.RATE_TABLE)
    )
    compiled = sa.text(statement).compile(dialect=dialect)
    assert str(compiled) == (
        "SET NOCOUNT ON; "
        "DECLARE @tau float = ?, @step float = ?, @wait float = ?, @next float, "
        "@now float, @slot float; "
        "SELECT @next = next_at FROM sqlqueue_rate_limits WITH (UPDLOCK, ROWLOCK) "
        "WHERE name = ?; "
        "SET @now = DATEDIFF_BIG(microsecond, '19700101', SYSUTCDATETIME()) / 1e6; "
        "SET @slot = CASE WHEN @next > @now - @tau THEN @next ELSE @now - @tau END; "
        "IF @slot - @now <= @wait "
        "UPDATE sqlqueue_rate_limits SET next_at = @slot + @step WHERE name = ?; "
        "ELSE SET @slot = NULL; "
        "SELECT @slot - @now;"
    )
    assert compiled.positiontup == ["tau", "step", "wait", "name", "name"]


def test_revision_0012_offline_tsql():
    statements = revision_statements("0012_rate_limits")
    assert statements == [
        "IF OBJECT_ID(N'sqlqueue_rate_limits', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE sqlqueue_rate_limits (\n"
        "    name NVARCHAR(450) NOT NULL, \n"  # 900 bytes: SQL Server's key limit
        "    next_at DOUBLE PRECISION NOT NULL, \n"
        "    CONSTRAINT pk_sqlqueue_rate_limits PRIMARY KEY (name)\n"
        ")\nEND;",
        "DROP TABLE sqlqueue_rate_limits;",
    ]
