"""Snapshot of the public surface (as NServiceBus's APIApprovals): changing it is a decision."""

import inspect

import sqlqueue_orm

EXPECTED_ALL = [
    "ConfigurationError",
    "DatabaseError",
    "DuplicateMessage",
    "IncomingMessage",
    "Outbox",
    "OutboxDispatcher",
    "OutgoingMessage",
    "QueueAddress",
    "QueueNotFound",
    "Routing",
    "SqlQueueError",
    "Transport",
    "UnitOfWork",
    "__version__",
    "queue_model",
    "queue_table",
    "unit_of_work",
]

TRANSPORT_METHODS = {
    "create_queue": "(self, queue, *, body_string=False)",
    "send": (
        "(self, queue, message, connection=None, *, delay=None, deliver_at=None, endpoint=None)"
    ),
    "send_many": "(self, queue, messages, connection=None)",
    "receive": "(self, queue, max_messages=1, connection=None)",
    "peek": "(self, queue, connection=None)",
    "purge_expired": "(self, queue, batch_size=10000)",
    "purge_all": "(self, queue)",
    "list_queues": "(self, schemas=None)",
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


def test_every_public_name_has_a_docstring():
    for name in sqlqueue_orm.__all__:
        if name != "__version__":
            assert inspect.getdoc(getattr(sqlqueue_orm, name)), name


def test_one_root_exception():
    for name in ("ConfigurationError", "DatabaseError", "DuplicateMessage", "QueueNotFound"):
        assert issubclass(getattr(sqlqueue_orm, name), sqlqueue_orm.SqlQueueError)

