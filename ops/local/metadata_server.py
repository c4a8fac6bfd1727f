"""A loopback GCE metadata server: attributes, instance values, token, guest attributes.

Standard library only, in-process (a thread), so tests and `tpuctl rehearse` can
change attributes, preempt the VM or announce maintenance while an agent is
long-polling. Behaves like the real one where the agent relies on it
(cloud.google.com/compute/docs/metadata/querying-metadata): every request needs
`Metadata-Flavor: Google`; `?wait_for_change=true` on any value blocks until its
ETag differs from `last_etag` (at once when it already differs; without
`last_etag`, until the value changes from what it was) or `timeout_sec` passes,
then answers the current value with its `ETag` header;
`instance/attributes/?recursive=true` answers every attribute as one JSON object.
`instance/preempted` is FALSE until `preempt()` (cloud.google.com/compute/docs/
instances/preemptible#detecting), `instance/maintenance-event` NONE until
`set_maintenance_event()` (.../metadata/getting-live-migration-notice) and
`instance/upcoming-maintenance` NONE until `set_upcoming_maintenance()` announces a
window, as JSON with the documented snake_case fields
(.../instances/monitor-plan-host-maintenance-event).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from ops.local.loopback import LoopbackServer

PREFIX = "/computeMetadata/v1/"
ATTRIBUTES = "instance/attributes/"
GUEST_ATTRIBUTES = "instance/guest-attributes/"
TOKEN = "instance/service-accounts/default/token"
PREEMPTED = "instance/preempted"
MAINTENANCE_EVENT = "instance/maintenance-event"
UPCOMING_MAINTENANCE = "instance/upcoming-maintenance"
FAKE_TOKEN = "fake-metadata-token"
_LONGEST_WAIT = 3600.0


class MetadataServer(LoopbackServer):
    """Serve `attributes` (and `instance/name`) on 127.0.0.1 until `close()`."""

    def __init__(self, attributes: Mapping[str, str], *, instance_name: str = "test-node"):
        self._lock = threading.Condition()
        self._attributes = dict(attributes)
        self._instance = {"instance/name": instance_name, PREEMPTED: "FALSE",
                          MAINTENANCE_EVENT: "NONE", UPCOMING_MAINTENANCE: "NONE"}
        self.guest_attributes: dict[str, str] = {}
        self.token_requests = 0
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every GET
        super().__init__(_handler_for(self))

    @property
    def host(self) -> str:
        """The `GCE_METADATA_HOST` value that points a client here."""
        return self.address

    def set_attributes(self, changes: Mapping[str, str | None]) -> None:
        """Change attributes (None removes one); wakes every long-poll."""
        with self._lock:
            for key, value in changes.items():
                if value is None:
                    self._attributes.pop(key, None)
                else:
                    self._attributes[key] = value
            self._lock.notify_all()

    def preempt(self) -> None:
        """What Compute Engine does when it preempts the VM: instance/preempted turns TRUE."""
        self._set_instance(PREEMPTED, "TRUE")

    def set_maintenance_event(self, value: str) -> None:
        """e.g. TERMINATE_ON_HOST_MAINTENANCE, then NONE again once it is over."""
        self._set_instance(MAINTENANCE_EVENT, value)

    def set_upcoming_maintenance(self, start: str | None, end: str = "",
                                 kind: str = "SCHEDULED", status: str = "PENDING") -> None:
        """Announce a maintenance window (RFC 3339 times), or none with `start=None`."""
        window = None if start is None else json.dumps({
            "can_reschedule": False, "latest_window_start_time": start,
            "maintenance_status": status, "type": kind, "window_end_time": end,
            "window_start_time": start}, indent=2, sort_keys=True)
        self._set_instance(UPCOMING_MAINTENANCE, window or "NONE")

    def _set_instance(self, path: str, value: str) -> None:
        with self._lock:
            self._instance[path] = value
            self._lock.notify_all()

    def long_polls(self, path: str) -> list[dict[str, str]]:
        """The queries of every wait_for_change request on `path` so far."""
        with self._lock:
            return [query for got, query in self.requests
                    if got == path and query.get("wait_for_change") == "true"]

    def attributes(self) -> dict[str, str]:
        with self._lock:
            return dict(self._attributes)

    def guest(self, namespace: str) -> dict[str, str]:
        """Guest attributes written under `namespace/` so far."""
        with self._lock:
            prefix = namespace.rstrip("/") + "/"
            return {key[len(prefix):]: value for key, value in self.guest_attributes.items()
                    if key.startswith(prefix)}

    def close(self) -> None:
        with self._lock:
            self._lock.notify_all()
        super().close()

    # -- request handling (called from the server's threads) --------------------

    def read(self, path: str, query: Mapping[str, str]) -> tuple[int, str]:
        with self._lock:
            self.requests.append((path, dict(query)))
        if path == TOKEN:
            with self._lock:
                self.token_requests += 1
            return 200, json.dumps({"access_token": FAKE_TOKEN, "expires_in": 3599,
                                    "token_type": "Bearer"})
        if path.startswith(GUEST_ATTRIBUTES):
            value = self.guest_attributes.get(path[len(GUEST_ATTRIBUTES):])
            return (404, "not found") if value is None else (200, value)
        wait = query.get("wait_for_change") == "true"
        timeout = min(float(query.get("timeout_sec", _LONGEST_WAIT)), _LONGEST_WAIT)
        with self._lock:
            if wait and self._value(path, query) is not None:
                seen = query.get("last_etag") or etag_of(self._value(path, query))
                self._lock.wait_for(lambda: etag_of(self._value(path, query)) != seen,
                                    timeout=timeout)
            value = self._value(path, query)
        return (404, "not found") if value is None else (200, value)

    def _value(self, path: str, query: Mapping[str, str]) -> str | None:
        if path in self._instance:
            return self._instance[path]
        if not path.startswith(ATTRIBUTES):
            return None
        key = path[len(ATTRIBUTES):]
        if key == "":
            if query.get("recursive") == "true":
                return json.dumps(self._attributes, sort_keys=True)
            return "".join(f"{name}\n" for name in sorted(self._attributes))
        return self._attributes.get(key)

    def write_guest_attribute(self, path: str, value: str) -> int:
        if not path.startswith(GUEST_ATTRIBUTES) or path.count("/") != 3:
            return 404
        with self._lock:
            self.guest_attributes[path[len(GUEST_ATTRIBUTES):]] = value
        return 200


def etag_of(value: str | None) -> str:
    return hashlib.sha256((value or "").encode()).hexdigest()[:16]


def _handler_for(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path, query = self._parse()
            if path is None:
                return
            status, body = server.read(path, query)
            self._answer(status, body, etag_of(body) if status == 200 else None)

        def do_PUT(self) -> None:
            path, _ = self._parse()
            if path is None:
                return
            length = int(self.headers.get("Content-Length", 0))
            value = self.rfile.read(length).decode()
            self._answer(server.write_guest_attribute(path, value), "")

        def _parse(self) -> tuple[str | None, dict[str, str]]:
            url = urlsplit(self.path)
            if self.headers.get("Metadata-Flavor") != "Google":
                self._answer(403, "Missing Metadata-Flavor: Google header")
                return None, {}
            if not url.path.startswith(PREFIX):
                self._answer(404, "not found")
                return None, {}
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            return url.path[len(PREFIX):], query

        def _answer(self, status: int, body: str, etag: str | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(data)))
            try:
                self.end_headers()
                self.wfile.write(data)
            except ConnectionError:
                pass  # the client went away mid long-poll (a killed agent)

        def log_message(self, *args: object) -> None:
            pass  # quiet: tests read state, not access logs

    return Handler
