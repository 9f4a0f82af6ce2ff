"""Property test: any name a database accepts round-trips, quoted, and never runs as SQL."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqlqueue_orm import OutgoingMessage, QueueAddress
from sqlqueue_orm.exceptions import InvalidQueueName

SQL_SHAPED = st.sampled_from(["'", '"', "[", "]", "]]", ";", "--", "/*", "%", "%s", ":x", "?", "@"])
names = st.lists(
    st.one_of(SQL_SHAPED, st.text(st.characters(blacklist_characters="\x00"), max_size=6)),
    min_size=1,
    max_size=6,
).map("".join).filter(lambda name: name.strip() != "" and name == name.rstrip())


@given(name=names)
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_accepted_name_round_trips(database, name):
    transport = database.transport()
    transport.create_queue("sentinel")
    try:
        address = QueueAddress(name)
        address.check_for(database.dialect)
    except InvalidQueueName:  # refused up front (too long, a lone surrogate, ...): by the API too
        with pytest.raises(InvalidQueueName):
            transport.create_queue(QueueAddress(name))
        return
    transport.create_queue(address)
    transport.send(address, OutgoingMessage(name))
    [message] = transport.receive(QueueAddress.parse(str(address)))
    assert message.body == name.encode()
    transport.purge_all(address)
    assert transport.peek("sentinel") == 0
