"""A loopback HTTP proxy that answers 503 to the first N matching requests.

Put it between a client and a server (e.g. the storage emulator) to check that
the client retries: `FaultProxy(upstream, failures=3, match="alt=media")`.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler

from ops.local.loopback import LoopbackServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class FaultProxy(LoopbackServer):
    def __init__(self, upstream: str, *, failures: int, match: str = "", status: int = 503):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.match = match
        self.status = status
        self.failures_left = failures
        self.faults_sent = 0
        self.matched = 0  # matching requests, failed or forwarded
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

    def forward(self, method: str, path: str, headers: dict[str, str],
                body: bytes | None) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                                timeout=60)
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
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            status, answer_headers, data = proxy.forward(self.command, self.path, headers, body)
            self._send(status, answer_headers, data)

        def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay  # noqa: N815 (http.server)

        def log_message(self, *args: object) -> None:
            pass

    return Handler
