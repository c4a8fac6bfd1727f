"""A loopback proxy that gives the storage emulator GCS's create-only upload.

gcp-storage-emulator ignores `ifGenerationMatch` (it overwrites). GCS documents
`ifGenerationMatch=0` as "the request succeeds only if there are no live versions of
the object", else HTTP 412 Precondition Failed (cloud.google.com/storage/docs/
request-preconditions). `CreateOnlyProxy(emulator.host)` forwards everything and answers
an upload with `ifGenerationMatch=0` for an object that exists with that 412, checking
and uploading under one lock, as GCS's own check is atomic.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler

from ops.local.loopback import LoopbackServer
from tests.fakes.fault_proxy import HOP_BY_HOP, FaultProxy

UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o$")
# The object's name: in the query (media uploads) or in the metadata part (multipart).
NAME_IN_BODY = re.compile(rb'"name"\s*:\s*"(?P<name>[^"]+)"')


class CreateOnlyProxy(LoopbackServer):
    def __init__(self, upstream: str):
        self.relay = FaultProxy(upstream)  # its forward() only; never started as a proxy
        self.relay.close()
        self.lock = threading.Lock()
        self.refused = 0
        super().__init__(_handler_for(self))

    @property
    def host(self) -> str:
        """The `STORAGE_EMULATOR_HOST` value that points a client here."""
        return f"http://{self.address}"

    def exists(self, bucket: str, name: str) -> bool:
        path = f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
        status, _, _ = self.relay.forward("GET", path, {}, None)
        return status == 200


def _handler_for(proxy: CreateOnlyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            parts = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parts.query)
            upload = UPLOAD.match(parts.path)
            if upload and query.get("ifGenerationMatch") == ["0"]:
                name = (query.get("name") or [None])[0]
                if name is None and (found := NAME_IN_BODY.search(body or b"")):
                    name = found["name"].decode()
                with proxy.lock:
                    if name is not None and proxy.exists(upload["bucket"], name):
                        proxy.refused += 1
                        error = {"error": {"code": 412, "message": "At least one of the "
                                           "pre-conditions you specified did not hold."}}
                        self._send(412, [("Content-Type", "application/json")],
                                   json.dumps(error).encode())
                        return
                    self._send(*proxy.relay.forward(self.command, self.path, headers, body))
                return
            self._send(*proxy.relay.forward(self.command, self.path, headers, body))

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
