"""A small fault-injecting HTTP proxy on 127.0.0.1, between the pipeline and the moto server.

Each distinct request (method, path with query, range) is given a fate from a seeded random
plan: pass, fail its first attempts with 503 SlowDown / 500 InternalError, or answer its first
attempt only after a delay. A retry of the same request then passes, so a client that retries
(botocore's standard mode does) recovers, and one that does not fails — deterministically. The
requests `refuse` picks are answered 503 SlowDown on every attempt instead, so botocore's retries
run out on them, for `refuse_seconds` after the first refusal when given (an S3 incident that
ends). `retry_after` adds a `Retry-After` header to every injected error. What was injected is
counted (and the refused paths listed), so a test can show the faults really happened.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
}
ERRORS = [(503, "SlowDown", "Please reduce your request rate."), (500, "InternalError", "Oops.")]


@dataclass
class FaultPlan:
    """A share of requests fails `failures` times, another share is slow once."""

    error_share: float = 0.0
    failures: int = 2
    slow_share: float = 0.0
    slow_seconds: float = 0.0
    seed: int = 9
    refuse: Callable[[str, str], bool] | None = None  # (method, path) → refused every time
    refuse_seconds: float | None = None  # refusing ends this long after the first refusal
    retry_after: int | None = None  # seconds, sent as `Retry-After` with each injected error
    injected: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)  # the paths refused, in order
    _refusing_since: float | None = None
    _fates: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _refusing(self) -> bool:
        """Still within `refuse_seconds` of the first refusal (which starts the clock)."""
        now = time.monotonic()
        if self._refusing_since is None:
            self._refusing_since = now
        return self.refuse_seconds is None or now - self._refusing_since < self.refuse_seconds

    def next_fate(self, key: tuple[str, str, str]) -> str:
        """`pass`, `error:<n>` or `slow` for this attempt of the request `key`."""
        with self._lock:
            if self.refuse is not None and self.refuse(key[0], key[1]) and self._refusing():
                self.injected["refused"] += 1
                self.refused.append(key[1])
                return "error:0"
            if key not in self._fates:
                draw = self._rng.random()
                if draw < self.error_share:
                    fates = [f"error:{i % len(ERRORS)}" for i in range(self.failures)]
                elif draw < self.error_share + self.slow_share:
                    fates = ["slow"]
                else:
                    fates = []
                self._fates[key] = fates
            fates = self._fates[key]
            fate = fates.pop(0) if fates else "pass"
            if fate != "pass":
                self.injected[fate.split(":")[0]] += 1
            return fate


class FaultProxy:
    """`http://127.0.0.1:<port>` forwarding to `upstream` under `plan`; a context manager."""

    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        target = urlsplit(upstream)
        self.plan = plan
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _relay(self) -> None:
                body = self._body()
                key = (self.command, self.path, self.headers.get("Range", ""))
                fate = proxy.plan.next_fate(key)
                if fate.startswith("error"):
                    status, code, message = ERRORS[int(fate.split(":")[1])]
                    payload = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                        f"<Message>{message}</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    if proxy.plan.retry_after is not None:
                        self.send_header("Retry-After", str(proxy.plan.retry_after))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                if fate == "slow":
                    time.sleep(proxy.plan.slow_seconds)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["Content-Length"] = str(len(body))
                upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    upstream_conn.request(self.command, self.path, body=body, headers=headers)
                    response = upstream_conn.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    for name, value in response.getheaders():
                        if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                            self.send_header(name, value)
                    length = response.getheader("Content-Length")
                    if self.command == "HEAD" and length is not None:
                        self.send_header("Content-Length", length)
                    else:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream_conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class CopyCuttingProxy:
    """A TCP proxy before PostgreSQL that cuts the first connection to start a COPY, just before
    its data reaches the server — to the client and to its transaction, what a server restart
    mid-COPY looks like. Later connections pass untouched (the server is "back")."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.cut = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CopyCuttingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._upstream)
                self._sockets += [client, server]
                threading.Thread(
                    target=self._pump, args=(client, server, True), daemon=True
                ).start()
                threading.Thread(
                    target=self._pump, args=(server, client, False), daemon=True
                ).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        copy_started = False
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if from_client and not self.cut.is_set():
                    if copy_started:  # the COPY's data: the "server" goes away instead
                        self.cut.set()
                        for sock in (source, target):
                            # shutdown wakes the other pump's recv, so the close really happens
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
                            sock.shutdown(socket.SHUT_RDWR)
                            sock.close()
                        return
                    copy_started = b"COPY " in data
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


LINGER_RESET = struct.pack("ii", 1, 0)  # close with RST, as a dying server's host would
