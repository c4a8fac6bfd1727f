"""A threaded HTTP server on 127.0.0.1 (a free port) for the loopback fakes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LoopbackServer:
    """Serves `handler` in a daemon thread until `close()` (or the `with` block ends)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        """host:port"""
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
