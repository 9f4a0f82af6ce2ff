"""T-SQL of publish/subscribe: revision 0010 offline, and NServiceBus's own statements.

The .NET statements below are test vectors copied from SqlServerConstants.cs
(src/NServiceBus.Transport.SqlServer/Queuing/, Particular/NServiceBus.SqlServer 214c4e8f):
ours must be the same statements, parameter for parameter, once whitespace is normalized and
``@Name`` is written ``:name``.
"""

from __future__ import annotations

import re

from sqlalchemy.dialects import mssql
from sqlalchemy.dialects.mssql import pyodbc
from sqlalchemy.schema import CreateTable

from sqlqueue_orm import dialects
from sqlqueue_orm.addressing import QueueAddress
from sqlqueue_orm.models.subscription import subscription_table
from sqlqueue_orm.queuing import sql
from tests.tsql.offline import revision_statements

DOTNET_SUBSCRIBE = """
MERGE {0} WITH (HOLDLOCK, TABLOCK) AS target
USING(SELECT @Endpoint AS Endpoint, @QueueAddress AS QueueAddress, @Topic AS Topic) AS source
ON target.Endpoint = source.Endpoint
AND target.Topic = source.Topic
WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN
UPDATE SET QueueAddress = @QueueAddress
WHEN NOT MATCHED THEN
INSERT
(
    QueueAddress,
    Topic,
    Endpoint
)
VALUES
(
    @QueueAddress,
    @Topic,
    @Endpoint
);"""
DOTNET_UNSUBSCRIBE = """
DELETE FROM {0}
WHERE
    Endpoint = @Endpoint and
    Topic = @Topic"""
DOTNET_GET_SUBSCRIBERS = """
SELECT DISTINCT QueueAddress
FROM {0}
WHERE Topic IN ({1})
"""
PARAMETERS = {"@Endpoint": ":endpoint", "@QueueAddress": ":queue_address", "@Topic": ":topic"}


def _normalized(text: str) -> str:
    for dotnet, ours in PARAMETERS.items():
        text = text.replace(dotnet, ours)
    text = text.replace("{0}", "{table}").replace("{1}", "{topics}")
    text = re.sub(r"\s+", " ", text).strip()
    return text.replace("( ", "(").replace(" )", ")")


def test_subscribe_unsubscribe_and_lookup_are_nservicebus_statements():
    support = dialects.for_dialect("mssql")
    assert _normalized(support.subscribe) == _normalized(DOTNET_SUBSCRIBE)
    assert _normalized(support.unsubscribe) == _normalized(DOTNET_UNSUBSCRIBE)
    assert _normalized(support.subscribers) == _normalized(DOTNET_GET_SUBSCRIBERS)


def test_statements_as_pyodbc_gets_them():
    dialect = pyodbc.dialect(paramstyle="qmark")  # pyodbc's own
    table = sql.format_table(dialect, QueueAddress("SubscriptionRouting", "dbo"))
    subscribe = sql.render(dialects.for_dialect("mssql").subscribe, dialect, table)
    assert subscribe.text == (
        "MERGE [dbo].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target "
        "USING(SELECT ? AS Endpoint, ? AS QueueAddress, ? AS Topic) AS source "
        "ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic "
        "WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN "
        "UPDATE SET QueueAddress = ? "
        "WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) VALUES (?, ?, ?);"
    )
    assert subscribe.params({"endpoint": "E", "queue_address": "Q", "topic": "T"}) == (
        "E", "Q", "T", "Q", "Q", "T", "E"
    )
    unsubscribe = sql.render(dialects.for_dialect("mssql").unsubscribe, dialect, table)
    assert unsubscribe.text == (
        "DELETE FROM [dbo].[SubscriptionRouting] WHERE Endpoint = ? and Topic = ?"
    )


def test_the_table_is_the_dotnet_installers_table():
    assert str(CreateTable(subscription_table("mssql")).compile(dialect=mssql.dialect())) == (
        "\nCREATE TABLE [SubscriptionRouting] (\n"
        "\t[QueueAddress] NVARCHAR(200) NOT NULL, \n"
        "\t[Endpoint] NVARCHAR(200) NOT NULL, \n"
        "\t[Topic] NVARCHAR(200) NOT NULL, \n"
        "\tPRIMARY KEY CLUSTERED ([Endpoint], [Topic])\n"
        ")\n\n"
    )


def test_revision_0010_offline_tsql():
    statements = revision_statements("0010_subscription_routing")
    assert statements == [
        "IF OBJECT_ID(N'[SubscriptionRouting]', N'U') IS NULL\nBEGIN\n"
        "CREATE TABLE [SubscriptionRouting] (\n"
        "    [QueueAddress] NVARCHAR(200) NOT NULL, \n"
        "    [Endpoint] NVARCHAR(200) NOT NULL, \n"
        "    [Topic] NVARCHAR(200) NOT NULL, \n"
        "    PRIMARY KEY CLUSTERED ([Endpoint], [Topic])\n"
        ")\nEND;",
        "DROP TABLE [SubscriptionRouting];",
    ]
