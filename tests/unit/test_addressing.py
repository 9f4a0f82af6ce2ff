import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqlqueue_orm import ConfigurationError, QueueAddress
from sqlqueue_orm.exceptions import InvalidQueueName


@pytest.mark.parametrize(
    ("text", "table", "schema", "catalog"),
    [
        ("orders", "orders", None, None),
        ("orders@sales", "orders", "sales", None),
        ("orders@[sales]", "orders", "sales", None),
        ("orders@[sales]@[erp]", "orders", "sales", "erp"),
        ("orders@[sa]]les]@[e@rp]", "orders", "sa]les", "e@rp"),
        ("[my@queue]@[dbo]", "my@queue", "dbo", None),
        ("a[b]c@s", "a[b]c", "s", None),
        ("q@@[cat]", "q", None, "cat"),
        ("ünïcödé queue@[schéma]", "ünïcödé queue", "schéma", None),
    ],
)
def test_parse(text, table, schema, catalog):
    assert QueueAddress.parse(text) == QueueAddress(table, schema, catalog)


@pytest.mark.parametrize(
    ("address", "text"),
    [
        (QueueAddress("orders"), "orders"),
        (QueueAddress("orders", "sales"), "orders@[sales]"),
        (QueueAddress("orders", "sa]les", "erp"), "orders@[sa]]les]@[erp]"),
        (QueueAddress("my@queue", "dbo"), "[my@queue]@[dbo]"),
        (QueueAddress("q", None, "cat"), "q@[]@[cat]"),
    ],
)
def test_format(address, text):
    assert str(address) == text
    assert address.format("mssql") == address.format("sqlite") == text


# .NET vectors: src/NServiceBus.Transport.SqlServer.UnitTests/QueueAddressTests.cs of
# Particular/NServiceBus.SqlServer at 214c4e8f06175186e356677546ea2d8e0f2b0c55.
DOTNET_SQL_SERVER_PARSE = [
    ("my.table", "my.table", None, None),
    ("my.table@[my.schema]", "my.table", "my.schema", None),
    ("my.table@[my.sch@ma]", "my.table", "my.sch@ma", None),
    ("my.table@[my.sch[[]ma]", "my.table", "my.sch[[]ma", None),
    ("my.table@my.schema", "my.table", "my.schema", None),
    ("my.table@[my.schema]@[my.catalog]", "my.table", "my.schema", "my.catalog"),
    ("my.table@[my.schema]@[my.c@talog]", "my.table", "my.schema", "my.c@talog"),
    ("my.table@[my.schema]@[my.c[[]talog]", "my.table", "my.schema", "my.c[[]talog"),
    ("my.table@[my.schema]@my.catalog", "my.table", "my.schema", "my.catalog"),
    ("my.table@my.schema@my.catalog", "my.table", "my.schema", "my.catalog"),
    ("my.table@[]@[my.catalog]", "my.table", None, "my.catalog"),
    ("my.table@[]@my.catalog", "my.table", None, "my.catalog"),
    ("my.table@my]schema", "my.table", "my]schema", None),
    ("my.table@my]]schema", "my.table", "my]]schema", None),
    ("my.table@[my]]schema]", "my.table", "my]schema", None),
    ("my.table@my[schema", "my.table", "my[schema", None),
    # SafeUnquote: a blank part is none.
    ("q@[ ]@[c]", "q", None, "c"),
]


@pytest.mark.parametrize(("text", "table", "schema", "catalog"), DOTNET_SQL_SERVER_PARSE)
def test_sql_server_form_reads_as_dotnet_does(text, table, schema, catalog):
    for dialect in (None, "mssql", "sqlite"):
        assert QueueAddress.parse(text, dialect) == QueueAddress(table, schema, catalog)


# Same file: the formatted (Value) vectors whose inputs are unquoted names.
@pytest.mark.parametrize(
    ("address", "text"),
    [
        (QueueAddress("my.table"), "my.table"),
        (QueueAddress("my.table", "my.schema"), "my.table@[my.schema]"),
        (QueueAddress("my.table", "my.schema", "my.catalog"), "my.table@[my.schema]@[my.catalog]"),
        (QueueAddress("my.table", None, "my.catalog"), "my.table@[]@[my.catalog]"),
    ],
)
def test_sql_server_form_writes_as_dotnet_does(address, text):
    assert address.format("mssql") == text


# PostgreSQL form: PostgreSql/Addressing/QueueAddress.cs (Parse: first '.' outside quotes) and
# CanonicalQueueAddress.cs ("schema"."table"), PostgreSqlNameHelper.cs, same commit.
@pytest.mark.parametrize(
    ("text", "table", "schema"),
    [
        ('"public"."orders"', "orders", "public"),
        ('"sales"."Samples.Sales"', "Samples.Sales", "sales"),
        ('public."orders"', "orders", "public"),  # a bare part is taken as written
        ('Sales."Orders"', "Orders", "Sales"),  # not case-folded
        ('"orders"', "orders", None),
        ('"a.b"."c""d"', 'c"d', "a.b"),
        ('a.b."c"', 'b."c"', "a"),  # split at the first dot outside quotes
        # No double quote: .NET never writes that; it stays one name (endpoint names hold dots).
        ("Samples.Sales", "Samples.Sales", None),
        ("orders", "orders", None),
        ('"q@x"', "q@x", None),  # '@' inside quotes: still the PostgreSQL form
        ('"".orders', "orders", None),  # blank schema is none
        # '@' outside quotes: the table@[schema] form this library has always read.
        ("orders@[sales]", "orders", "sales"),
        ("Samples.Sales@[dbo]", "Samples.Sales", "dbo"),
    ],
)
def test_postgresql_form_reads_as_dotnet_does(text, table, schema):
    assert QueueAddress.parse(text, "postgresql") == QueueAddress(table, schema)


@pytest.mark.parametrize(
    ("address", "text"),
    [
        (QueueAddress("orders", "public"), '"public"."orders"'),
        (QueueAddress("Samples.Sales", "my schema"), '"my schema"."Samples.Sales"'),
        (QueueAddress('c"d', 'a"b'), '"a""b"."c""d"'),
        (QueueAddress("orders"), '"orders"'),
    ],
)
def test_postgresql_form_writes_as_dotnet_does(address, text):
    assert address.format("postgresql") == text


def test_only_postgresql_addresses_take_the_current_schema():
    """The .NET PostgreSQL transport always writes "schema"."table"; the others as given."""
    asked: list[str] = []

    def current() -> str:
        asked.append("current_schema()")
        return "public"

    assert QueueAddress("orders").qualified("postgresql", current).format("postgresql") == (
        '"public"."orders"'
    )
    assert QueueAddress("orders", "s").qualified("postgresql", current) == QueueAddress(
        "orders", "s"
    )
    for other in ("mssql", "sqlite", None):
        assert QueueAddress("orders").qualified(other, current) == QueueAddress("orders")
    assert asked == ["current_schema()"]  # asked only when an address needs it
    assert QueueAddress("orders").qualified("postgresql", lambda: None) == QueueAddress("orders")


def test_postgresql_form_has_no_catalog():
    with pytest.raises(ConfigurationError, match="cat"):
        QueueAddress("q", "s", "cat").format("postgresql")


@pytest.mark.parametrize("bad", ['""', '"public".""', '"public". '])
def test_postgresql_blank_table_is_refused(bad):
    with pytest.raises(InvalidQueueName, match="empty"):
        QueueAddress.parse(bad, "postgresql")


@pytest.mark.parametrize("bad", ["", "@schema", "a@b@c@d"])
def test_bad_addresses_are_refused_with_the_address_named(bad):
    with pytest.raises(ConfigurationError) as info:
        QueueAddress.parse(bad)
    assert repr(bad) in str(info.value) or bad == ""


def test_empty_blank_and_nul_names_are_refused():
    with pytest.raises(InvalidQueueName, match="empty"):
        QueueAddress("")
    with pytest.raises(InvalidQueueName, match="whitespace"):
        QueueAddress("q", " ")
    with pytest.raises(InvalidQueueName, match="NUL"):
        QueueAddress("a\x00b")


@pytest.mark.parametrize(
    ("dialect", "name", "ok"),
    [
        ("postgresql", "x" * 63, True),
        ("postgresql", "x" * 64, False),
        ("postgresql", "é" * 32, False),  # 64 bytes in UTF-8
        ("mssql", "x" * 128, True),
        ("mssql", "x" * 129, False),
    ],
)
def test_length_limits_per_dialect(dialect, name, ok):
    address = QueueAddress(name)
    if ok:
        address.check_for(dialect)
    else:
        with pytest.raises(InvalidQueueName) as info:
            address.check_for(dialect)
        assert name in str(info.value)


def test_catalog_only_on_sql_server():
    QueueAddress("q", "dbo", "other").check_for("mssql")
    with pytest.raises(ConfigurationError, match="other"):
        QueueAddress("q", "public", "other").check_for("postgresql")


# Any name a database can store: no NUL, no lone surrogate (refused, see below), not blank.
names = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=40,
).filter(lambda name: name.strip() != "")


@given(names, st.none() | names, st.none() | names)
def test_format_then_parse_round_trips(table, schema, catalog):
    address = QueueAddress(table, schema, catalog)
    assert QueueAddress.parse(str(address)) == address
    assert QueueAddress.parse(address.format("mssql"), "mssql") == address


@given(names, st.none() | names)
def test_postgresql_format_then_parse_round_trips(table, schema):
    address = QueueAddress(table, schema)
    assert QueueAddress.parse(address.format("postgresql"), "postgresql") == address


@pytest.mark.parametrize("name", ["\udd0e", "orders\ud800", "\udc80x"])
def test_a_lone_surrogate_in_a_name_is_refused_naming_it(name):
    with pytest.raises(InvalidQueueName, match="lone surrogate"):
        QueueAddress(name)
    with pytest.raises(InvalidQueueName, match="lone surrogate"):
        QueueAddress("orders", name)
