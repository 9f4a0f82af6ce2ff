from sqlqueue_orm import OutgoingMessage


def test_send_receive(database):
    transport = database.transport()
    transport.create_queue("smoke")
    transport.send("smoke", OutgoingMessage(b"x"))
    [message] = transport.receive("smoke")
    assert message.body == b"x"
