"""Snapshot of the public surface (as NServiceBus's APIApprovals): changing it is a decision."""

import importlib
import inspect

import sqlqueue_orm

EXPECTED_ALL = [
    "ConfigurationError",
    "DatabaseError",
    "DuplicateMessage",
    "Endpoint",
    "EndpointSettings",
    "HandlerContext",
    "IncomingMessage",
    "OutgoingMessage",
    "QueueAddress",
    "QueueNotFound",
    "SqlQueueError",
    "TransactionMode",
    "Transport",
    "UnitOfWork",
    "__version__",
    "alembic_filter",
    "queue_model",
]

#: Every public method of Transport, with its signature: the whole of its surface.
TRANSPORT_METHODS = {
    "close": "(self)",
    "begin": "(self)",
    "address_text": "(self, queue)",
    "create_queue": "(self, queue, *, body_string=False)",
    "create_queues": "(self, queues)",
    "create_delayed_table": "(self, endpoint)",
    "create_subscription_table": "(self)",
    "send": (
        "(self, queue, message, connection=None, *, delay=None, deliver_at=None, endpoint=None)"
    ),
    "send_many": "(self, queue, messages, connection=None)",
    "reply": "(self, to, message, connection=None)",
    "receive": "(self, queue, max_messages=1, connection=None)",
    "browse": "(self, queue, max_messages=10, connection=None, *, after=None)",
    "browse_delayed": "(self, endpoint=None, schemas=None, max_messages=1000)",
    "peek": "(self, queue, connection=None)",
    "purge_expired": "(self, queue, batch_size=10000)",
    "purge_all": "(self, queue)",
    "list_queues": "(self, schemas=None)",
    "subscribe": "(self, endpoint, topic, queue=None, connection=None)",
    "unsubscribe": "(self, endpoint, topic, connection=None)",
    "publish": "(self, event, connection=None, *, type_names=None, topics=None)",
}

#: Transport's public properties: the collaborators the package's own parts use.
TRANSPORT_PROPERTIES = {"subscriptions"}

#: What left the top level, and the module it is imported from now.
MOVED_FROM_TOP = {
    "Outbox": "sqlqueue_orm.sending.outbox",
    "OutboxDispatcher": "sqlqueue_orm.sending.dispatcher",
    "Routing": "sqlqueue_orm.sending.routing",
    "queue_table": "sqlqueue_orm.models.queue_table",
    "unit_of_work": "sqlqueue_orm.session",
}

#: The subpackages the docs import from, and the names each exports (its ``__all__``): with
#: the top level, the whole of the documented API.
DOCUMENTED_SUBPACKAGES = {
    "sqlqueue_orm.migration": ["alembic_config"],
    "sqlqueue_orm.receiving": ["Endpoint", "EndpointSettings", "HandlerContext", "TransactionMode"],
    "sqlqueue_orm.recoverability": [
        "ErrorFilter",
        "ErrorQueue",
        "ErrorSearch",
        "FailedMessage",
        "FailureGroup",
        "FailureGroups",
        "Page",
    ],
    "sqlqueue_orm.sending": ["DispatcherSettings", "Outbox", "OutboxDispatcher", "Routing"],
}

ENDPOINT_METHODS = {
    "__init__": (
        "(self, name, transport, *, settings=None, user_database=None, outbox=None, "
        "on_critical_error=None, instrumentation=None, **overrides)"
    ),
    "handle": "(self, model, handler=None, *, type_name=None, event=False)",
    "map_type": "(self, model, type_name)",
    "subscribe": "(self, event_type, connection=None)",
    "unsubscribe": "(self, event_type, connection=None)",
    "publish": "(self, event, connection=None)",
    "handle_raw": "(self, handler)",
    "send": (
        "(self, destination, message, connection=None, *, delay=None, deliver_at=None, "
        "reply_to_this_instance=False)"
    ),
    "start": "(self)",
    "prepare_pumps": "(self)",
    "stop": "(self, timeout=None)",
    "wait": "(self, timeout=None)",
    "run": "(self, *, once=False)",
    "close": "(self)",
}

#: Every public name of Endpoint: the methods above and its two counters and instance queue.
#: Helpers users never call (handler dispatch, what sends carry) live in receiving.handling;
#: prepare_pumps is the start's first half, which the AsyncEndpoint runs too.
ENDPOINT_PUBLIC = sorted([*ENDPOINT_METHODS.keys() - {"__init__"}, "address_text",
                          "instance_address", "instance_stats", "stats"])

HANDLER_CONTEXT_METHODS = {
    "send": "(self, destination, message, *, reply_to_this_instance=False)",
    "reply": "(self, message)",
    "publish": "(self, event)",
}


def _plain(signature: inspect.Signature) -> str:
    return str(
        signature.replace(
            parameters=[
                p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()
            ],
            return_annotation=inspect.Signature.empty,
        )
    )


def test_all_is_sorted_and_as_approved():
    assert sqlqueue_orm.__all__ == EXPECTED_ALL
    assert sorted(sqlqueue_orm.__all__) == sqlqueue_orm.__all__


def test_transport_signatures():
    for name, expected in TRANSPORT_METHODS.items():
        assert _plain(inspect.signature(getattr(sqlqueue_orm.Transport, name))) == expected, name


def test_transport_has_no_other_public_member():
    public = {name for name in vars(sqlqueue_orm.Transport) if not name.startswith("_")}
    assert public == set(TRANSPORT_METHODS) | TRANSPORT_PROPERTIES


def test_what_left_the_top_level_is_imported_from_its_module():
    for name, module_name in MOVED_FROM_TOP.items():
        assert not hasattr(sqlqueue_orm, name), name
        module = importlib.import_module(module_name)
        assert inspect.getdoc(getattr(module, name)), name


def test_endpoint_signatures():
    for cls, methods in (
        (sqlqueue_orm.Endpoint, ENDPOINT_METHODS),
        (sqlqueue_orm.HandlerContext, HANDLER_CONTEXT_METHODS),
    ):
        for name, expected in methods.items():
            signature = _plain(inspect.signature(getattr(cls, name)))
            assert signature == expected, (cls.__name__, name)


def test_endpoint_has_no_public_name_beyond_the_snapshot():
    public = sorted(name for name in vars(sqlqueue_orm.Endpoint) if not name.startswith("_"))
    assert public == ENDPOINT_PUBLIC


def test_every_public_name_has_a_docstring():
    for name in sqlqueue_orm.__all__:
        if name != "__version__":
            assert inspect.getdoc(getattr(sqlqueue_orm, name)), name


def test_one_root_exception():
    for name in ("ConfigurationError", "DatabaseError", "DuplicateMessage", "QueueNotFound"):
        assert issubclass(getattr(sqlqueue_orm, name), sqlqueue_orm.SqlQueueError)


def test_documented_subpackages_export_what_the_docs_import():
    for module_name, names in DOCUMENTED_SUBPACKAGES.items():
        module = importlib.import_module(module_name)
        assert module.__all__ == names, module_name
        for name in names:
            assert inspect.getdoc(getattr(module, name)), (module_name, name)
