"""SQLite durability is a documented setting: NORMAL by default, FULL on request."""

from __future__ import annotations

import pytest

from sqlqueue_orm import ConfigurationError, OutgoingMessage, Transport, db

# PRAGMA synchronous reports 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.


def _synchronous(engine: object) -> int:
    with engine.connect() as connection:  # type: ignore[attr-defined]
        return int(connection.exec_driver_sql("PRAGMA synchronous").scalar_one())


def test_default_is_normal(tmp_path):
    engine = db.create_engine(f"sqlite:///{tmp_path / 'q.db'}")
    assert _synchronous(engine) == 1
    engine.dispose()


def test_full_syncs_every_commit_and_queues_still_work(tmp_path):
    engine = db.create_engine(f"sqlite:///{tmp_path / 'q.db'}", sqlite_synchronous="full")
    assert _synchronous(engine) == 2
    with Transport(engine) as transport:
        transport.create_queue("orders")
        transport.send("orders", OutgoingMessage(b"kept"))
        assert [m.body for m in transport.receive("orders")] == [b"kept"]
    engine.dispose()


def test_bad_value_is_named(tmp_path):
    with pytest.raises(ConfigurationError, match="'sometimes'"):
        db.create_engine(f"sqlite:///{tmp_path / 'q.db'}", sqlite_synchronous="sometimes")
