"""Webhook receivers for the tests: real sockets on 127.0.0.1, each answering its connections by a script."""
from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Request:
    head: dict[str, str]
    body: bytes
    opened: float  # time.monotonic() when the connection was accepted
    closed: float | None = None  # when the client closed (or reset) it, seen by this side


@dataclass
class Receiver:
    """``answers``: one per connection, in order (the last repeats): ``("status", code, extra headers)`` answers
    at once; ``("trickle", seconds)`` sends ``HTTP/1.1 200 OK`` one byte every ``seconds`` until the client
    goes away."""

    answers: list = field(default_factory=lambda: [("status", 204, {})])
    requests: list[Request] = field(default_factory=list)
    tls: ssl.SSLContext | None = None  # a server context: the connections are TLS

    def __post_init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def target(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/notice") -> str:
        return self.target + path

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # wakes the accept() under way: a closed fd alone keeps listening
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            answer = self.answers[min(self.connections, len(self.answers) - 1)]
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn, answer), daemon=True).start()

    def _answer(self, conn: socket.socket, answer: tuple) -> None:
        request = Request({}, b"", time.monotonic())
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                conn.close()
                return
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            request.head = {"request-line": lines[0],
                            **{k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}}
            while len(body) < int(request.head.get("content-length", 0)):
                body += conn.recv(65536)
            request.body = body
            self.requests.append(request)
            if answer[0] == "status":
                extra = "".join(f"{k}: {v}\r\n" for k, v in answer[2].items())
                conn.sendall(f"HTTP/1.1 {answer[1]} X\r\nContent-Length: 0\r\n{extra}\r\n".encode())
            else:  # ("trickle", seconds)
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                    # Wait for the next byte's turn, or for the client to hang up (readable, then b"").
                    if select.select([conn], [], [], answer[1])[0]:
                        break
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        break
            request.closed = time.monotonic()
