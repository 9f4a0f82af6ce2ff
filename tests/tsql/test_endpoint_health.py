"""Golden tests: the T-SQL of endpoint health (heartbeats, samples, the head read, revision 0014).

No SQL Server runs here, so the text compiled by the mssql+pyodbc dialect is the contract. Each
instance writes only rows keyed by its own instance id, so a plain UPDATE by key (then an INSERT
the first time) needs no MERGE or lock hints.
"""


import sqlalchemy as sa

from sqlqueue_orm import addressing, health
from tests.tsql.offline import revision_statements

DIALECT = sa.create_engine("mssql+pyodbc://user:pw@host/db?driver=FreeTDS").dialect


def _tsql(statement: sa.ClauseElement) -> str:
    return " ".join(str(statement.compile(dialect=DIALECT)).split())


def test_the_head_read_skips_rows_being_written_or_taken():
    statement = health.head_statement(DIALECT, addressing.QueueAddress("orders", "sales"))
    compiled = statement.compile(dialect=DIALECT, compile_kwargs={"render_postcompile": True})
    assert " ".join(str(compiled).split()) == (
        "SELECT TOP 1 CAST(CAST([Headers] AS nvarchar(max)) AS varbinary(max)) "
        "FROM [sales].[orders] WITH (READPAST, READCOMMITTEDLOCK) "
        "ORDER BY [sales].[orders].[RowVersion]"
    )


def test_the_heartbeat_alone_is_one_update_by_key():
    assert health.beat_statement(DIALECT).text == (
        "UPDATE sqlqueue_endpoints SET endpoint = ?, host = ?, process_id = ?, state = ?, "
        "started_at = ?, last_seen = ?, beat_interval = ?, concurrency = ?, in_flight = ?, "
        "processed = ?, failed = ?, processed_rate = ?, failed_rate = ? WHERE instance_id = ?"
    )


def test_the_head_read_alone_has_its_row_limit_written_in():
    text = health.head_text(DIALECT, addressing.QueueAddress("orders", "sales"))
    assert " ".join(text.split()) == (
        "SELECT TOP 1 CAST(CAST([Headers] AS nvarchar(max)) AS varbinary(max)) "
        "FROM [sales].[orders] WITH (READPAST, READCOMMITTEDLOCK) "
        "ORDER BY [sales].[orders].[RowVersion]"
    )


def test_the_samples_alone_are_one_multi_row_insert():
    statement = health.samples_statement(DIALECT, 2)
    assert statement.text == (
        "INSERT INTO sqlqueue_queue_metrics (queue, sampled_at, instance_id, depth, oldest_age, "
        "processed, failed) VALUES (?, ?, ?, ?, ?, ?, ?), (?, ?, ?, ?, ?, ?, ?)"
    )
    assert statement.names[:2] == ("queue_a", "sampled_at_a")
    assert statement.names[7:9] == ("queue_b", "sampled_at_b")


def test_the_heartbeat_is_an_update_by_key_and_pruning_a_range_delete():
    update = (
        health.ENDPOINTS.update()
        .where(health.ENDPOINTS.c.instance_id == "i")
        .values(state="running", last_seen=1.0, processed=2)
    )
    assert _tsql(update) == (
        "UPDATE sqlqueue_endpoints SET state=?, last_seen=?, processed=? "
        "WHERE sqlqueue_endpoints.instance_id = ?"
    )
    assert _tsql(health.METRICS.delete().where(health.METRICS.c.sampled_at < 1.0)) == (
        "DELETE FROM sqlqueue_queue_metrics WHERE sqlqueue_queue_metrics.sampled_at < ?"
    )


def test_revision_0014_offline_tsql():
    statements = revision_statements("0014_endpoint_health")
    assert statements == [
        "IF OBJECT_ID(N'sqlqueue_endpoints', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE sqlqueue_endpoints (\n"
        "    instance_id NVARCHAR(48) NOT NULL, \n"
        "    endpoint NVARCHAR(450) NOT NULL, \n"
        "    host NVARCHAR(255) NOT NULL, \n"
        "    process_id INTEGER NOT NULL, \n"
        "    state NVARCHAR(16) NOT NULL, \n"
        "    started_at DOUBLE PRECISION NOT NULL, \n"
        "    last_seen DOUBLE PRECISION NOT NULL, \n"
        "    beat_interval DOUBLE PRECISION NOT NULL, \n"
        "    concurrency INTEGER NOT NULL, \n"
        "    in_flight INTEGER NOT NULL, \n"
        "    processed BIGINT NOT NULL, \n"
        "    failed BIGINT NOT NULL, \n"
        "    processed_rate DOUBLE PRECISION NOT NULL, \n"
        "    failed_rate DOUBLE PRECISION NOT NULL, \n"
        "    CONSTRAINT pk_sqlqueue_endpoints PRIMARY KEY (instance_id)\n"
        ")\nEND;",
        "IF OBJECT_ID(N'sqlqueue_queue_metrics', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE sqlqueue_queue_metrics (\n"
        "    queue NVARCHAR(390) NOT NULL, \n"  # the key: 780 + 8 + 96 bytes, under 900
        "    sampled_at DOUBLE PRECISION NOT NULL, \n"
        "    instance_id NVARCHAR(48) NOT NULL, \n"
        "    depth BIGINT NULL, \n"
        "    oldest_age DOUBLE PRECISION NULL, \n"
        "    processed BIGINT NOT NULL, \n"
        "    failed BIGINT NOT NULL, \n"
        "    CONSTRAINT pk_sqlqueue_queue_metrics PRIMARY KEY (queue, sampled_at, instance_id)\n"
        ")\nEND;",
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = "
        "N'ix_sqlqueue_queue_metrics_sampled_at' AND object_id = "
        "OBJECT_ID(N'sqlqueue_queue_metrics'))\n"
        "CREATE INDEX ix_sqlqueue_queue_metrics_sampled_at ON sqlqueue_queue_metrics "
        "(sampled_at);",
        "DROP TABLE sqlqueue_queue_metrics;",
        "DROP TABLE sqlqueue_endpoints;",
    ]
