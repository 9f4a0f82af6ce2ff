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
        (QueueAddress("q", None, "cat"), "q@@[cat]"),
    ],
)
def test_format(address, text):
    assert str(address) == text


@pytest.mark.parametrize("bad", ["", "@schema", "a@b@c@d"])
def test_bad_addresses_are_refused_with_the_address_named(bad):
    with pytest.raises(ConfigurationError) as info:
        QueueAddress.parse(bad)
    assert repr(bad) in str(info.value) or bad == ""


def test_empty_and_nul_names_are_refused():
    with pytest.raises(InvalidQueueName, match="empty"):
        QueueAddress("")
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


names = st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=40)


@given(names, st.none() | names, st.none() | names)
def test_format_then_parse_round_trips(table, schema, catalog):
    address = QueueAddress(table, schema, catalog)
    assert QueueAddress.parse(str(address)) == address
