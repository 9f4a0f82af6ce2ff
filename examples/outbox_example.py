"""Save your own model and send messages in one transaction; deliver to another database."""

import sys

from sqlalchemy import String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlqueue_orm import OutgoingMessage, Transport, UnitOfWork
from sqlqueue_orm.sending import DispatcherSettings, Outbox, OutboxDispatcher, Routing

APP_URL = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///shop.db"
LEDGER_URL = sys.argv[2] if len(sys.argv) > 2 else "sqlite:///ledger.db"


class Base(DeclarativeBase):
    """Your application's own declarative base: nothing of sqlqueue_orm in it."""


class Order(Base):
    """An order of the shop."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    total: Mapped[int]


transport = Transport(APP_URL)
Base.metadata.create_all(transport.engine)
transport.create_queue("billing")  # in the shop's database
# The ledger queue lives in another database: only the outbox can reach it atomically.
outbox = Outbox(transport, Routing({"ledger": LEDGER_URL}))
outbox.create_table()  # or: sqlqueue migrate
outbox.router.transport_for("ledger").create_queue("ledger")

# 1. Direct: the message is an INSERT into billing, in the same transaction as the order.
with UnitOfWork(transport, outbox=outbox) as uow:
    order = Order(customer="ann", total=120)
    uow.session.add(order)
    uow.send("billing", OutgoingMessage(b'{"invoice": "ann"}'))
print("order", order.id, "billing has", transport.peek("billing"), "message(s)")

# 2. An exception rolls back the order and the message together.
try:
    with UnitOfWork(transport, outbox=outbox) as uow:
        uow.session.add(Order(customer="bob", total=5))
        uow.send("billing", OutgoingMessage(b'{"invoice": "bob"}'))
        raise RuntimeError("payment declined")
except RuntimeError:
    pass
with transport.engine.connect() as connection:
    orders = connection.scalar(select(func.count()).select_from(Order))
print("orders:", orders, "billing has", transport.peek("billing"), "message(s)")

# 3. Outbox: the ledger message is stored in OutboxData with the order, and dispatched to
#    the other database right after the commit. De-duplicated by the incoming message id.
for attempt in (1, 2):  # the same incoming message delivered twice
    with UnitOfWork(transport, outbox=outbox, incoming_message_id="payment-42") as uow:
        if uow.already_handled:
            print("attempt", attempt, "skipped:", uow.outcome.value)
            continue
        uow.session.add(Order(customer="carol", total=42))
        uow.send("ledger", OutgoingMessage(b'{"credit": 42}'))
        print("attempt", attempt, "handled")

# 4. The dispatcher delivers whatever the inline dispatch could not (crash, outage). As a
#    service: `sqlqueue --url ... outbox dispatch --routes routes.toml`; here, one pass.
report = OutboxDispatcher(outbox, DispatcherSettings(grace_period=0)).dispatch_pending()
print("dispatcher:", report.describe())

ledger = outbox.router.transport_for("ledger")
for message in ledger.receive("ledger", max_messages=10):
    print("ledger received", message.text)
for message in transport.receive("billing", max_messages=10):
    print("billing received", message.text)
outbox.close()
transport.close()
