"""A loopback HTTP proxy that breaks answers, for the agent's fault tests.

Put it between a client and a server (the storage emulator, the metadata server):

- `FaultProxy(upstream, failures=3, match="alt=media")`: the first 3 matching requests
  get a 503 (or `status`);
- `FaultProxy(upstream, chaos=Chaos(seed=7, rate=0.2))`: each request, with
  probability `rate` (seeded), gets one of the faults flaky links and proxies produce:
  a 503 or a 429 instead of the answer, the connection dropped before any answer
  (after the upstream handled the request), a body cut short (the full Content-Length
  announced, then the connection closed half-way), or a chunked body dropped mid-way;
- `stall={"packages%2Fv2": 300}`: a matching request's answer is held that many
  seconds (a download that hangs), then sent.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from ops.local.loopback import LoopbackServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
CHAOS_KINDS = ("503", "429", "drop", "cut", "chunked-cut")
UPSTREAM_TIMEOUT_SECONDS = 120.0  # above the metadata server's 60 s long-polls


@dataclass
class Chaos:
    seed: int
    rate: float = 0.2
    kinds: tuple[str, ...] = CHAOS_KINDS


class FaultProxy(LoopbackServer):
    def __init__(self, upstream: str, *, failures: int = 0, match: str = "", status: int = 503,
                 chaos: Chaos | None = None, stall: dict[str, float] | None = None):
        self.upstream = urllib.parse.urlsplit(upstream if "://" in upstream
                                              else f"http://{upstream}")
        self.match = match
        self.status = status
        self.failures_left = failures
        self.faults_sent = 0
        self.matched = 0  # matching requests, failed or forwarded
        self.chaos = chaos
        self.chaos_sent: Counter[str] = Counter()
        self.stall = dict(stall or {})
        self.stalled = 0
        self._random = random.Random(chaos.seed if chaos else 0)
        self._lock = threading.Lock()
        super().__init__(_handler_for(self))

    @property
    def host(self) -> str:
        return f"http://{self.address}"

    def should_fail(self, path: str) -> bool:
        with self._lock:
            if self.match not in path:
                return False
            self.matched += 1
            if self.failures_left > 0:
                self.failures_left -= 1
                self.faults_sent += 1
                return True
            return False

    def chaos_kind(self) -> str | None:
        """The fault for this request (seeded), or None."""
        if self.chaos is None:
            return None
        with self._lock:
            if self._random.random() >= self.chaos.rate:
                return None
            kind = self._random.choice(self.chaos.kinds)
            self.chaos_sent[kind] += 1
            return kind

    def stall_seconds(self, path: str) -> float:
        for fragment, seconds in self.stall.items():
            if fragment in path:
                with self._lock:
                    self.stalled += 1
                return seconds
        return 0.0

    def forward(self, method: str, path: str, headers: dict[str, str],
                body: bytes | None) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                                timeout=UPSTREAM_TIMEOUT_SECONDS)
        try:
            connection.request(method, path, body=body, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if proxy.should_fail(self.path):
                self._send(proxy.status, [], b"injected fault\n")
                return
            kind = proxy.chaos_kind()
            if kind in ("503", "429"):
                self._send(int(kind), [], b"injected fault\n")
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            status, answer_headers, data = proxy.forward(self.command, self.path, headers, body)
            if seconds := proxy.stall_seconds(self.path):
                time.sleep(seconds)
            if kind == "drop":
                self.close_connection = True
                return  # the connection closes with no answer at all
            if kind == "cut":
                self._send(status, answer_headers, data, cut=True)
                return
            if kind == "chunked-cut":
                self._send_chunked_cut(status, answer_headers, data)
                return
            self._send(status, answer_headers, data)

        def _headers(self, status: int, headers: list[tuple[str, str]]) -> None:
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)

        def _send(self, status: int, headers: list[tuple[str, str]], data: bytes,
                  cut: bool = False) -> None:
            self._headers(status, headers)
            self.send_header("Content-Length", str(len(data)))
            if cut:
                self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(ConnectionError):
                self.wfile.write(data[:len(data) // 2] if cut else data)
            if cut:
                self.close_connection = True

        def _send_chunked_cut(self, status: int, headers: list[tuple[str, str]],
                              data: bytes) -> None:
            self._headers(status, headers)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            half = data[:max(1, len(data) // 2)]
            with contextlib.suppress(ConnectionError):
                self.wfile.write(f"{len(half):x}\r\n".encode() + half + b"\r\n")
            self.close_connection = True  # no last chunk: the body ends mid-way

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay  # noqa: N815 (http.server)

        def log_message(self, *args: object) -> None:
            pass

    return Handler
