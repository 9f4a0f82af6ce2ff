"""The PostgreSQL wake-up's statements: the keys baked into the trigger and the registration.

The trigger's ``WHEN`` and the waiter's registration must name the same slots and table key,
and the key must be a literal the catalog prints back unchanged (a positive 31-bit number), so
a start can tell the trigger in place is current without re-creating it.
"""

from __future__ import annotations

from sqlqueue_orm import dialects

WAKEUP = dialects.postgresql.NOTIFY_WAKEUP


def test_the_table_key_is_stable_positive_and_told_apart_by_schema():
    key = WAKEUP.table_key("public", "orders")
    assert key == WAKEUP.table_key("public", "orders")
    assert 0 <= key < 2**31
    assert WAKEUP.table_key("sales", "orders") != key
    assert all(0 <= WAKEUP.table_key("s", f"q{n}") < 2**31 for n in range(1_000))


def test_the_trigger_tests_every_slot_and_registration_tries_them_in_turn():
    key = WAKEUP.table_key("public", "orders")
    trigger = WAKEUP.trigger_statement('"orders"', key)
    register = WAKEUP.register_statement(key)
    for slot in WAKEUP.slot_keys():
        assert f"pg_try_advisory_xact_lock_shared({slot}, {key})" in trigger
        assert f"WHEN pg_try_advisory_lock({slot}, {key}) THEN {slot}" in register
    assert "FOR EACH STATEMENT WHEN (NOT (" in trigger
    assert len(set(WAKEUP.slot_keys())) == WAKEUP.slots


def test_a_trigger_is_current_only_with_this_tables_key_and_every_slot():
    key = WAKEUP.table_key("public", "orders")
    source = "BEGIN PERFORM pg_notify('sqlqueue_wakeup', TG_TABLE_NAME); RETURN NULL; END"
    printed = WAKEUP.trigger_statement("public.orders", key).replace("WHEN (", "WHEN ((") + ")"
    assert WAKEUP.trigger_is_current(printed, source, key)
    assert not WAKEUP.trigger_is_current(printed, source, key + 1)
    old = (
        "CREATE TRIGGER sqlqueue_wakeup AFTER INSERT ON public.orders FOR EACH STATEMENT "
        "EXECUTE FUNCTION sqlqueue_wakeup_notify()"
    )
    assert not WAKEUP.trigger_is_current(old, source, key)
    wider = WAKEUP.trigger_statement("public.orders", key).replace(
        "WHEN (NOT (",
        f"WHEN (NOT (pg_try_advisory_xact_lock_shared({WAKEUP.slot_namespace + 9}, {key}) AND ",
    )
    assert not WAKEUP.trigger_is_current(wider, source, key)
