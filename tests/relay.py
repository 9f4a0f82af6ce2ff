"""A TCP relay in front of a test database that a test can cut silently, as a failed link does.

``with Relay(host, port) as relay:`` listens on a free loopback port (:attr:`Relay.port`) and
forwards every connection to *host*:*port* on one thread. :meth:`Relay.cut` stops forwarding
both ways without closing anything: bytes sent into the cut stay unanswered, new connections
are not taken up (the kernel's backlog holds them, unanswered), and no reset or end of stream
reaches either side. :meth:`Relay.heal` forwards again, and what was held is delivered as TCP
delivers it once a link is back: at the sender's next retransmission, whose interval doubled
with every one lost in the cut (:data:`RETRANSMITS` for data, :data:`SYN_RETRIES` for a new
connection, after the first byte or connection held). A side that closed its socket meanwhile
has its peer closed.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

#: Seconds after a segment is first sent at which Linux retransmits it (an RTO of 200 ms,
#: doubling, at most 120 s apart).
RETRANSMITS = tuple(0.2 * (2 ** (n + 1) - 1) for n in range(10)) + tuple(
    204.6 + 120 * n for n in range(1, 20)
)
#: Seconds after a connection attempt at which Linux sends its SYN again (1 s, doubling).
SYN_RETRIES = (1.0, 3.0, 7.0, 15.0, 31.0, 63.0)


def delivered_at(first: float, now: float, schedule: tuple[float, ...]) -> float:
    """When a segment first sent at *first* gets through a link back since *now*."""
    return next((first + after for after in schedule if first + after >= now), now)


class Relay:
    """Forwards a loopback port to a server; :meth:`cut` blackholes it, :meth:`heal` resumes."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, socket.socket] = {}
        #: Sockets with bytes (the listener: connections) waiting since the cut: since when.
        self._held: dict[socket.socket, float] = {}
        #: Connections taken in the cut, not yet connected on to the server.
        self._unconnected: set[socket.socket] = set()
        self._cut = threading.Event()
        self._healed = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(5)
        for sock in [*self._peers, *self._unconnected]:
            sock.close()
        self._listener.close()

    def cut(self) -> None:
        """Stop forwarding, both ways, closing nothing."""
        self._cut.set()

    def heal(self) -> None:
        """Forward again (what the cut held, at its next retransmission)."""
        self._healed = time.monotonic()
        self._cut.clear()

    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        while not self._stopping.is_set():
            cut = self._cut.is_set()
            now = time.monotonic()
            waiting = False
            for key, _ in self._selector.select(0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept(now if cut else None)
                    continue
                if sock.fileno() < 0:  # closed with its peer earlier in this round
                    continue
                if cut:
                    self._held.setdefault(sock, now)
                    waiting = True
                    continue
                since = self._held.get(sock)
                if since is not None:
                    schedule = RETRANSMITS if sock in self._peers else SYN_RETRIES
                    if now < delivered_at(since, self._healed, schedule):
                        waiting = True
                        continue
                    del self._held[sock]
                if sock in self._unconnected:  # attempted in the cut: its SYN gets through
                    self._connect(sock)
                elif sock in self._peers:
                    self._forward(sock)
            if waiting:
                time.sleep(0.02)  # held sockets stay readable: do not spin on them

    def _accept(self, cut_since: float | None) -> None:
        """Take a connection; one attempted in the cut waits, unconnected, for its SYN's turn."""
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if cut_since is None:
            self._connect(client)
        else:
            self._held[client] = cut_since
            self._unconnected.add(client)
            self._selector.register(client, selectors.EVENT_READ)

    def _connect(self, client: socket.socket) -> None:
        if client in self._unconnected:  # held since the cut, and readable now
            self._unconnected.discard(client)
            self._held.pop(client, None)
            self._selector.unregister(client)
            try:
                gave_up = client.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gave_up = True
            if gave_up:  # the client gave up before the link was back: nothing reaches on
                client.close()
                return
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peers[client], self._peers[server] = server, client
        self._selector.register(client, selectors.EVENT_READ)
        self._selector.register(server, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        for each in (sock, peer):  # one side closed (or failed): close the other
            self._peers.pop(each, None)
            self._held.pop(each, None)
            self._selector.unregister(each)
            each.close()
