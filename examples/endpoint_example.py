"""Two endpoints in a request/reply conversation: sales replies to the client's order.

One order fails until its item is restocked: it is retried at once, then later (delayed
retries), then moved to the error queue; ``sqlqueue errors retry`` sends it back, and it is placed.
"""

import sys
import time
from collections.abc import Callable

import pydantic

from sqlqueue_orm import Endpoint, HandlerContext, Transport, cli
from sqlqueue_orm.recoverability import ErrorQueue


class PlaceOrder(pydantic.BaseModel):
    """A command: place this order."""

    order_id: int


class OrderPlaced(pydantic.BaseModel):
    """The reply: the order was placed."""

    order_id: int


url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///shop.db"
transport = Transport(url)
# Delayed retries after 0.5, 1 and 1.5 s here (NServiceBus's default: 10, 20, 30 s).
sales = Endpoint("sales", transport, peek_delay=0.1, delayed_retry_increase=0.5)
client = Endpoint("client", transport, peek_delay=0.1)
placed: list[int] = []
in_stock = {42}


# A .NET endpoint sending Shop.Messages.PlaceOrder reaches this handler too.
@sales.handle(PlaceOrder, type_name="Shop.Messages.PlaceOrder")
def place_order(order: PlaceOrder, context: HandlerContext) -> None:
    """Place the order and reply."""
    if order.order_id not in in_stock:
        raise LookupError(f"the item of order {order.order_id} is out of stock")
    # TRANSACTION_SCOPE (the default): the receive, context.session and this reply commit
    # together, or the message goes back to the queue.
    context.reply(OrderPlaced(order_id=order.order_id))


@client.handle(OrderPlaced, type_name="Shop.Messages.OrderPlaced")
def order_placed(event: OrderPlaced, context: HandlerContext) -> None:
    """Note the reply."""
    placed.append(event.order_id)


def wait_for(condition: Callable[[], bool]) -> None:
    """Poll *condition* for up to 30 seconds."""
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


sales.start()  # creates the queues (sales, client, error) if missing
client.start()
client.send("sales", PlaceOrder(order_id=42))  # ReplyToAddress: client
client.send("sales", PlaceOrder(order_id=7))  # 5 immediate retries x 4: then to "error"
errors = ErrorQueue(transport)
wait_for(lambda: placed == [42] and errors.count() == 1)
print(f"order {placed[0]} placed")
print(f"order 7 failed: {errors.list()[0].exception_message}", flush=True)
in_stock.add(7)  # restocked: send the failed message back to the sales queue
cli.main(["--url", url, "errors", "retry", "--all"])  # the shell's: sqlqueue errors retry --all
wait_for(lambda: 7 in placed)
client.stop()  # in-flight handlers finish (30 s at most), then the pump ends
sales.stop()
print(f"order {placed[-1]} placed")
