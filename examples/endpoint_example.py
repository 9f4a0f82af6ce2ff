"""Two endpoints in a request/reply conversation: sales replies to the client's order."""

import sys
import time

import pydantic

from sqlqueue_orm import Endpoint, HandlerContext, Transport


class PlaceOrder(pydantic.BaseModel):
    """A command: place this order."""

    order_id: int


class OrderPlaced(pydantic.BaseModel):
    """The reply: the order was placed."""

    order_id: int


transport = Transport(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///shop.db")
sales = Endpoint("sales", transport, peek_delay=0.1)
client = Endpoint("client", transport, peek_delay=0.1)
placed: list[int] = []


# A .NET endpoint sending Shop.Messages.PlaceOrder reaches this handler too.
@sales.handle(PlaceOrder, type_name="Shop.Messages.PlaceOrder")
def place_order(order: PlaceOrder, context: HandlerContext) -> None:
    """Place the order and reply."""
    # TRANSACTION_SCOPE (the default): the receive, context.session and this reply commit
    # together, or the message goes back to the queue.
    context.reply(OrderPlaced(order_id=order.order_id))


@client.handle(OrderPlaced, type_name="Shop.Messages.OrderPlaced")
def order_placed(event: OrderPlaced, context: HandlerContext) -> None:
    """Note the reply."""
    placed.append(event.order_id)


sales.start()  # creates the queues (sales, client, error) if missing
client.start()
client.send("sales", PlaceOrder(order_id=42))  # ReplyToAddress: client
deadline = time.monotonic() + 30
while not placed and time.monotonic() < deadline:
    time.sleep(0.05)
client.stop()  # in-flight handlers finish (30 s at most), then the pump ends
sales.stop()
print(f"order {placed[0]} placed")
