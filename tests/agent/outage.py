"""A TCP relay in front of the service that can be switched off: a real outage, as the agent sees one.

While down the port refuses connections (the listening socket is closed) and open connections are
cut, which is what an agent sees when the service's pods are gone; ``up()`` listens on the same port
again. Bytes are relayed untouched, so the agent talks HTTP to the real service throughout."""
from __future__ import annotations

import contextlib
import socket
import threading


class OutageProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self.listener: socket.socket | None = None
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.accepted = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> OutageProxy:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self.listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        return self

    def down(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            conns, self.connections = self.connections, set()
        if listener:
            listener.close()
        for conn in conns:
            _close(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self.lock:
                if self.listener is not listener:
                    _close(client), _close(upstream)
                    return
                self.connections |= {client, upstream}
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src), _close(dst)
            with self.lock:
                self.connections -= {src, dst}


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
