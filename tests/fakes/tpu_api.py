"""A fake Cloud TPU v2 REST API on loopback, for the real `tpu_v2.TpuClient`.

Aim a client at it with `transport="rest"`, `AnonymousCredentials()` and
`client_options={"api_endpoint": fake.endpoint}` (an `http://127.0.0.1:PORT` URL),
or set `TPU_STACK_TPU_ENDPOINT=fake.endpoint` for code that builds its own client.

Bodies are (de)serialised with google-cloud-tpu's own proto-plus classes, so a
field the client sends or expects is a field here too. Long-running operations
come back already done. State is scripted per resource: every read of a node
or queued resource (get or list) returns its current state, then moves it to
the next scripted one, so "CREATING, READY, PREEMPTED" is three polls.
Every request is logged in `calls` so tests can assert that a dry run changed
nothing. A fake serves one project; `add_project` serves another (a team's) at the
same endpoint with its own nodes, and a request for any other project is refused.
`latency` (seconds, 0 unless a test or bench sets it) delays every
answer as a round trip to tpu.googleapis.com would; requests in flight at once
wait side by side, as they do on the real API, and the fake the client talks to
records how many were in flight at once (`peak_in_flight`, per project
`peak_by_project`). `page_size` caps every list page (0: one page), so a client
must follow `next_page_token`; a page token it did not hand out is refused (400).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from google.cloud import tpu_v2, tpu_v2alpha1
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, json_format
from google.rpc import status_pb2

PATH = re.compile(
    r"^/v2(?:alpha1)?/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
    r"(?:/(?P<collection>[A-Za-z]+)(?:/(?P<id>[^/:]+))?)?(?::(?P<verb>[A-Za-z]+))?$"
)
NodeState = tpu_v2.Node.State
QueuedState = tpu_v2.QueuedResourceState.State
# Verbs that read only; everything else changes state.
READ_ONLY = {"GET list", "GET get", "POST getGuestAttributes"}
# (collection, action) -> the FakeTpuApi method that answers it.
ROUTES = {
    ("nodes", "getGuestAttributes"): "_guest_attributes",
    ("queuedResources", "create"): "_create_queued",
    ("queuedResources", "get"): "_get_queued",
    ("queuedResources", "list"): "_list_queued",
    ("queuedResources", "delete"): "_delete_queued",
    ("queuedResources", "reset"): "_reset_queued",
    ("acceleratorTypes", "list"): "_list_accelerator_types",
    # v2alpha1 only (google-cloud-tpu tpu_v2alpha1 TpuClient.list_reservations).
    ("reservations", "list"): "_list_reservations",
    ("runtimeVersions", "list"): "_list_runtime_versions",
    ("nodes", "list"): "_list_nodes",
    ("nodes", "get"): "_get_node",
    ("nodes", "create"): "_create_node",
    ("nodes", "patch"): "_patch_node",
    ("nodes", "delete"): "_delete_node",
    ("nodes", "stop"): "_stop_node",
    ("nodes", "start"): "_start_node",
}


@dataclass(frozen=True)
class Call:
    method: str  # HTTP method
    action: str  # list, get, create, delete, patch, stop, start, reset, getGuestAttributes
    collection: str  # nodes, queuedResources, acceleratorTypes, ...
    zone: str
    resource_id: str | None

    @property
    def mutating(self) -> bool:
        return f"{self.method} {self.action}" not in READ_ONLY


@dataclass
class _Scripted:
    message: object
    upcoming: list[int] = field(default_factory=list)


@dataclass
class _Fault:
    status: int
    remaining: int
    action: str | None
    collection: str | None
    message: str
    zone: str | None = None
    details: list[dict[str, Any]] = field(default_factory=list)


# Failures as the real API answers them (model/capacity.py, docs/tpu-facts.md "When
# a create fails"): the capacity message of a failed create operation (code 8), the
# message of a 429 quota refusal, and a reservation that cannot take the node (code 9).
CAPACITY_MESSAGE = ('There is no more capacity in the zone "{zone}"; you can try in another '
                    'zone where Cloud TPU Nodes are offered (see '
                    'https://cloud.google.com/tpu/docs/regions)')
QUOTA_MESSAGE = "Quota '{quota_id}' exhausted. Limit {limit} in region {region}"
RESERVATION_MESSAGE = ("Insufficient reserved capacity. Contact customer support to increase "
                       "your reservation.")
QUOTA_FAILURE_TYPE = "type.googleapis.com/google.rpc.QuotaFailure"


@dataclass
class FakeTpuApi:
    project: str = "acme-ml-dev"
    accelerator_types: dict[str, list[str]] = field(default_factory=dict)
    runtime_versions: dict[str, list[str]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    latency: float = 0.0
    projects: dict[str, FakeTpuApi] = field(default_factory=dict)
    page_size: int = 0
    peak_in_flight: int = 0
    peak_by_project: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], _Scripted] = {}
        self._queued: dict[tuple[str, str], _Scripted] = {}
        self._guest: dict[tuple[str, str], dict[int, dict[tuple[str, str], str]]] = {}
        self._faults: list[_Fault] = []
        self._queued_scripts: dict[str, list[str]] = {}
        self._queued_errors: dict[str, tuple[int, str]] = {}
        self._node_create_errors: dict[str, tuple[int, str]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._in_flight: dict[str, int] = {}
        self._reservations: dict[str, list[tpu_v2alpha1.Reservation]] = {}

    # ---- lifecycle ---------------------------------------------------------
    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeTpuApi:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        serve = partial(self._server.serve_forever, poll_interval=0.02)
        threading.Thread(target=serve, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- scripting ---------------------------------------------------------
    def add_project(self, project: str) -> FakeTpuApi:
        """Another project served at this endpoint, offering the same zones."""
        other = FakeTpuApi(project, dict(self.accelerator_types), dict(self.runtime_versions),
                           page_size=self.page_size)
        self.projects[project] = other
        return other

    @contextmanager
    def serving(self, path: str) -> Iterator[None]:
        """One request in flight for as long as it is answered (latency included)."""
        match = PATH.match(urlsplit(path).path)
        project = match["project"] if match else "?"
        with self._lock:
            self._in_flight[project] = self._in_flight.get(project, 0) + 1
            self.peak_by_project[project] = max(self.peak_by_project.get(project, 0),
                                                self._in_flight[project])
            self.peak_in_flight = max(self.peak_in_flight, sum(self._in_flight.values()))
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[project] -= 1

    def reset_peaks(self) -> None:
        with self._lock:
            self.peak_in_flight = 0
            self.peak_by_project.clear()

    def zones(self) -> set[str]:
        return set(self.accelerator_types) | set(self.runtime_versions)

    def add_node(
        self,
        zone: str,
        node_id: str,
        *states: str,
        accelerator_type: str = "v2-8",
        runtime_version: str = "tpu-vm-tf-2.18.0-pjrt",
        labels: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        spot: bool = False,
        health: str = "HEALTHY",
        symptoms: Iterable[str] = (),
        created: datetime | None = None,
    ) -> None:
        """A node whose reads return `states` in turn (default: READY forever)."""
        node = tpu_v2.Node(
            name=self._name(zone, "nodes", node_id),
            accelerator_type=accelerator_type,
            runtime_version=runtime_version,
            labels=labels or {},
            metadata=metadata or {},
            scheduling_config=tpu_v2.SchedulingConfig(spot=spot),
            health=tpu_v2.Node.Health[health],
            symptoms=[tpu_v2.Symptom(symptom_type=s, details=s.lower()) for s in symptoms],
            create_time=created or datetime.now(timezone.utc),
        )
        self._put_node(zone, node_id, node, list(states) or ["READY"])

    def add_queued_node(self, zone: str, node_id: str, *states: str, **node: Any) -> None:
        """An ACTIVE queued resource (id `<node_id>-qr`) and the node it provisioned."""
        self.add_node(zone, node_id, *states, **node)
        name = self.add_queued_request(zone, node_id, "ACTIVE")
        with self._lock:
            self._nodes[(zone, node_id)].message.queued_resource = name

    def add_queued_request(self, zone: str, node_id: str, *states: str) -> str:
        """A queued resource `<node_id>-qr` for one node, in `states` read by read."""
        queued_id = f"{node_id}-qr"
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=f"projects/{self.project}/locations/{zone}", node_id=node_id
        )
        queued = tpu_v2.QueuedResource(
            name=self._name(zone, "queuedResources", queued_id),
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
            state=tpu_v2.QueuedResourceState(state=QueuedState[states[0]]),
        )
        with self._lock:
            self._queued[(zone, queued_id)] = _Scripted(
                queued, [QueuedState[s] for s in states[1:]]
            )
        return queued.name

    def set_node_states(self, zone: str, node_id: str, *states: str) -> None:
        with self._lock:
            scripted = self._nodes[(zone, node_id)]
            scripted.message.state = NodeState[states[0]]
            scripted.upcoming = [NodeState[s] for s in states[1:]]

    def set_queued_states(self, zone: str, queued_id: str, *states: str) -> None:
        with self._lock:
            scripted = self._queued[(zone, queued_id)]
            scripted.message.state.state = QueuedState[states[0]]
            scripted.upcoming = [QueuedState[s] for s in states[1:]]

    def script_queued(self, queued_id: str, *states: str, zone: str | None = None,
                      error: tuple[int, str] | None = None) -> None:
        """The states a queued resource created later goes through (in `zone` only, if
        given: a fallback's candidates share one id); `error` (google.rpc code, message)
        is its `failedData.error` once FAILED.

        Default: WAITING_FOR_RESOURCES, then ACTIVE. A last state of
        WAITING_FOR_RESOURCES waits for resources forever."""
        key = f"{zone}/{queued_id}" if zone else queued_id
        self._queued_scripts[key] = list(states)
        if error is not None:
            self._queued_errors[key] = error

    def refuse_for_quota(self, zone: str, quota_id: str, limit: int = 32) -> None:
        """Queued-resource creates in `zone` answer 429 RESOURCE_EXHAUSTED with a
        google.rpc.QuotaFailure naming `quota_id` in the zone's region."""
        region = zone.rsplit("-", 1)[0]
        message = QUOTA_MESSAGE.format(quota_id=quota_id, limit=limit, region=region)
        violation = {"subject": f"project:{self.project}", "description": message,
                     "quotaId": quota_id, "quotaDimensions": {"region": region}}
        self._faults.append(_Fault(429, 10**6, "create", "queuedResources", message, zone,
                                   [{"@type": QUOTA_FAILURE_TYPE, "violations": [violation]}]))

    def add_reservation(self, zone: str, reservation_id: str, size: int, used: int,
                        units: str = "CHIPS", state: str = "ACTIVE") -> None:
        """A TPU reservation of `size` `units`, `used` of them in use (v2alpha1
        Reservation.Standard: size, capacityUnits, usage.total)."""
        standard = tpu_v2alpha1.Reservation.Standard
        self._reservations.setdefault(zone, []).append(tpu_v2alpha1.Reservation(
            name=self._name(zone, "reservations", reservation_id),
            standard=standard(size=size, capacity_units=standard.CapacityUnits[units],
                              usage=standard.Usage(total=used)),
            state=tpu_v2alpha1.Reservation.State[state]))

    def fail_node_creates(self, zone: str, code: int = 8, message: str | None = None) -> None:
        """Node creates in `zone` return an operation that ends with `code` and `message`
        (default: code 8, the capacity message)."""
        self._node_create_errors[zone] = (code, message or CAPACITY_MESSAGE.format(zone=zone))

    def set_guest_attributes(
        self,
        zone: str,
        node_id: str,
        worker: int,
        values: dict[str, str],
        namespace: str = "tpu-stack",
    ) -> None:
        """What worker `worker` of a node has published under `namespace/`."""
        with self._lock:
            workers = self._guest.setdefault((zone, node_id), {})
            published = workers.setdefault(worker, {})
            published.update({(namespace, key): str(value) for key, value in values.items()})

    def fail(
        self,
        status: int,
        times: int = 1,
        action: str | None = None,
        collection: str | None = None,
        message: str = "",
        zone: str | None = None,
    ) -> None:
        """The next `times` matching requests (in `zone`, if given) answer with HTTP `status`
        (200: `message` is the body as it is, e.g. JSON cut short)."""
        self._faults.append(_Fault(status, times, action, collection, message, zone))

    def node(self, zone: str, node_id: str) -> tpu_v2.Node | None:
        scripted = self._nodes.get((zone, node_id))
        return None if scripted is None else tpu_v2.Node(scripted.message)

    def node_message(self, zone: str, node_id: str) -> tpu_v2.Node:
        """The live node, to change behind the client's back (as gcloud or GCP would)."""
        return self._nodes[(zone, node_id)].message

    def queued_resource(self, zone: str, queued_id: str) -> tpu_v2.QueuedResource | None:
        scripted = self._queued.get((zone, queued_id))
        return None if scripted is None else tpu_v2.QueuedResource(scripted.message)

    def mutating_calls(self) -> list[Call]:
        return [call for call in self.calls if call.mutating]

    def count(self, action: str, collection: str = "nodes") -> int:
        return sum(1 for c in self.calls if c.action == action and c.collection == collection)

    # ---- request handling (called by the HTTP handler) ------------------------
    def handle(self, method: str, url: str, body: bytes, binary: bool = False
               ) -> tuple[int, Any]:
        """(HTTP status, the answer as JSON text; with `binary`, a message's wire bytes)."""
        parts = urlsplit(url)
        match = PATH.match(parts.path)
        if match is None:
            return _error(404, "NOT_FOUND", f"no such path {parts.path}")
        if match["project"] != self.project:
            other = self.projects.get(match["project"])
            if other is not None:
                return other.handle(method, url, body, binary)
            # What Google APIs answer for a project the caller cannot see or that does
            # not exist (wording as seen from googleapis services; unconfirmed for TPU).
            return _error(403, "PERMISSION_DENIED",
                          f"Permission denied on resource project {match['project']}.")
        zone, collection, rid = match["zone"], match["collection"] or "", match["id"]
        action = match["verb"] or _action(method, rid)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self._lock:
            self.calls.append(Call(method, action, collection, zone, rid))
            fault = self._take_fault(action, collection, zone)
            if fault is not None:
                return fault
            if zone not in self.zones():
                return _error(
                    404, "NOT_FOUND", f"Location {zone} is not found or access is unauthorized."
                )
            if not _token_ok(query.get("pageToken", "")):
                return _error(400, "INVALID_ARGUMENT", "invalid page token")
            route = getattr(self, ROUTES.get((collection, action), ""), None)
            if route is None:
                return _error(
                    400, "INVALID_ARGUMENT", f"fake: {method} {parts.path} not implemented"
                )
            status, answer = route(zone, rid, query, body)
            if isinstance(answer, str):
                return status, answer
            # Serialised under the lock: a node's live message may change right after.
            return status, type(answer).serialize(answer) if binary else type(answer).to_json(
                answer)

    def _take_fault(self, action: str, collection: str, zone: str) -> tuple[int, str] | None:
        for fault in self._faults:
            if (
                fault.remaining
                and fault.action in (None, action)
                and fault.collection in (None, collection)
                and fault.zone in (None, zone)
            ):
                fault.remaining -= 1
                if fault.status == 200:  # an answer cut short: `message` is the whole body
                    return 200, fault.message
                status = {403: "PERMISSION_DENIED", 503: "UNAVAILABLE", 429: "RESOURCE_EXHAUSTED",
                          400: "INVALID_ARGUMENT"}
                return _error(
                    fault.status, status.get(fault.status, "UNKNOWN"), fault.message or "injected",
                    fault.details,
                )
        return None

    # nodes
    def _list_nodes(
        self, zone: str, _rid: None, query: dict[str, str], _body: bytes
    ) -> tuple[int, Any]:
        nodes = [self._read(s) for (z, _), s in sorted(self._nodes.items()) if z == zone]
        page, token = _page(nodes, query, self.page_size)
        return 200, tpu_v2.ListNodesResponse(nodes=page, next_page_token=token)

    def _get_node(
        self, zone: str, rid: str, _query: dict[str, str], _body: bytes
    ) -> tuple[int, Any]:
        scripted = self._nodes.get((zone, rid))
        if scripted is None:
            return _not_found("node", zone, rid)
        return 200, self._read(scripted)

    def _create_node(
        self, zone: str, _rid: None, query: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        node_id = query["nodeId"]
        if (zone, node_id) in self._nodes:
            return _error(409, "ALREADY_EXISTS", f"node {node_id} already exists")
        if zone in self._node_create_errors:
            return _failed_operation(zone, node_id, *self._node_create_errors[zone])
        node = tpu_v2.Node.from_json(body or b"{}", ignore_unknown_fields=True)
        node.name = self._name(zone, "nodes", node_id)
        node.create_time = datetime.now(timezone.utc)
        self._put_node(zone, node_id, node, ["CREATING", "READY"], lock=False)
        return _done(zone, node_id, tpu_v2.Node.pb(node))

    def _patch_node(
        self, zone: str, rid: str, query: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        scripted = self._nodes.get((zone, rid))
        if scripted is None:
            return _not_found("node", zone, rid)
        sent = tpu_v2.Node.from_json(body, ignore_unknown_fields=True)
        for path in query.get("updateMask", "").split(","):
            if path not in {"labels", "metadata", "description", "tags"}:
                return _error(400, "INVALID_ARGUMENT", f"field {path!r} cannot be updated")
            setattr(scripted.message, path, getattr(sent, path))
        return _done(zone, rid, tpu_v2.Node.pb(scripted.message))

    def _delete_node(
        self, zone: str, rid: str, _query: dict[str, str], _body: bytes
    ) -> tuple[int, Any]:
        scripted = self._nodes.pop((zone, rid), None)
        if scripted is None:
            return _not_found("node", zone, rid)
        self._guest.pop((zone, rid), None)
        for queued in self._queued.values():
            if any(spec.node_id == rid for spec in queued.message.tpu.node_spec):
                queued.message.state.state = QueuedState.SUSPENDING
                queued.upcoming = [QueuedState.SUSPENDED]
        return _done(zone, rid, empty_pb2.Empty())

    def _stop_node(
        self, zone: str, rid: str, _query: dict[str, str], _body: bytes
    ) -> tuple[int, Any]:
        return self._set_node_state(zone, rid, NodeState.STOPPED)

    def _start_node(
        self, zone: str, rid: str, _query: dict[str, str], _body: bytes
    ) -> tuple[int, Any]:
        return self._set_node_state(zone, rid, NodeState.READY)

    def _guest_attributes(
        self, zone: str, rid: str, _q: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if (zone, rid) not in self._nodes:
            return _not_found("node", zone, rid)
        request = json.loads(body or b"{}")
        prefix = request.get("queryPath", "")
        published = self._guest.get((zone, rid), {})
        # GetGuestAttributesRequest.worker_ids: "The 0-based worker ID. If it is empty,
        # all workers' GuestAttributes will be returned" (google-cloud-tpu). No order
        # is promised for all of them: the fake answers the highest worker first, so
        # code that takes the first entry for worker 0 fails here as it may on GCP.
        wanted = [int(w) for w in request.get("workerIds") or []]
        workers = wanted or sorted(published, reverse=True)
        response = tpu_v2.GetGuestAttributesResponse()
        for values in [published[w] for w in workers if w in published]:
            items = [
                tpu_v2.GuestAttributesEntry(namespace=namespace, key=key, value=value)
                for (namespace, key), value in sorted(values.items())
                if f"{namespace}/{key}".startswith(prefix)
            ]
            value = tpu_v2.GuestAttributesValue(items=items)
            response.guest_attributes.append(
                tpu_v2.GuestAttributes(query_path=prefix, query_value=value)
            )
        return 200, response

    # queued resources
    def _create_queued(
        self, zone: str, _rid: None, query: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        queued_id = query["queuedResourceId"]
        if (zone, queued_id) in self._queued:
            return _error(409, "ALREADY_EXISTS", f"queued resource {queued_id} already exists")
        queued = tpu_v2.QueuedResource.from_json(body or b"{}", ignore_unknown_fields=True)
        queued.name = self._name(zone, "queuedResources", queued_id)
        # Output only, set by the API (google-cloud-tpu tpu_v2 QueuedResource.create_time).
        queued.create_time = datetime.now(timezone.utc)
        key = f"{zone}/{queued_id}"
        key = key if key in self._queued_scripts else queued_id
        states = self._queued_scripts.pop(key, ["WAITING_FOR_RESOURCES", "ACTIVE"])
        queued.state = tpu_v2.QueuedResourceState(state=QueuedState[states[0]])
        if key in self._queued_errors:
            code, message = self._queued_errors.pop(key)
            queued.state.failed_data = tpu_v2.QueuedResourceState.FailedData(
                error=status_pb2.Status(code=code, message=message))
        self._queued[(zone, queued_id)] = _Scripted(queued, [QueuedState[s] for s in states[1:]])
        return _done(zone, queued_id, tpu_v2.QueuedResource.pb(queued))

    def _get_queued(self, zone: str, rid: str, _q: dict[str, str], _body: bytes) -> tuple[int, Any]:
        scripted = self._queued.get((zone, rid))
        if scripted is None:
            return _not_found("queued resource", zone, rid)
        return 200, self._read_queued(zone, scripted)

    def _list_queued(
        self, zone: str, _rid: None, query: dict[str, str], _b: bytes
    ) -> tuple[int, Any]:
        items = [self._read_queued(z, s) for (z, _), s in sorted(self._queued.items()) if z == zone]
        page, token = _page(items, query, self.page_size)
        response = tpu_v2.ListQueuedResourcesResponse(queued_resources=page, next_page_token=token)
        return 200, response

    def _delete_queued(
        self, zone: str, rid: str, query: dict[str, str], _b: bytes
    ) -> tuple[int, Any]:
        """As the API documents `DeleteQueuedResourceRequest.force` (google-cloud-tpu
        1.27): without force only an ACCEPTED, FAILED or SUSPENDED request is deleted;
        with force its nodes go first, then the request, whatever its state."""
        scripted = self._queued.get((zone, rid))
        if scripted is None:
            return _not_found("queued resource", zone, rid)
        deletable = {QueuedState.ACCEPTED, QueuedState.SUSPENDED, QueuedState.FAILED}
        if scripted.message.state.state not in deletable and query.get("force") != "true":
            state = scripted.message.state.state.name
            return _error(
                400,
                "FAILED_PRECONDITION",
                f"queued resource {rid} is {state}: delete it with force, or its nodes first",
            )
        for spec in scripted.message.tpu.node_spec:
            self._nodes.pop((zone, spec.node_id), None)
            self._guest.pop((zone, spec.node_id), None)
        del self._queued[(zone, rid)]
        return _done(zone, rid, empty_pb2.Empty())

    def _reset_queued(self, zone: str, rid: str, _q: dict[str, str], _b: bytes) -> tuple[int, Any]:
        scripted = self._queued.get((zone, rid))
        if scripted is None:
            return _not_found("queued resource", zone, rid)
        for spec in scripted.message.tpu.node_spec:
            self._nodes.pop((zone, spec.node_id), None)
        scripted.message.state.state = QueuedState.WAITING_FOR_RESOURCES
        scripted.upcoming = [QueuedState.ACTIVE]
        return _done(zone, rid, tpu_v2.QueuedResource.pb(scripted.message))

    # catalog
    def _list_accelerator_types(
        self, zone: str, _rid: None, query: dict[str, str], _b: bytes
    ) -> tuple[int, Any]:
        types = [
            tpu_v2.AcceleratorType(name=self._name(zone, "acceleratorTypes", t), type_=t)
            for t in self.accelerator_types.get(zone, [])
        ]
        page, token = _page(types, query, self.page_size)
        response = tpu_v2.ListAcceleratorTypesResponse(
            accelerator_types=page, next_page_token=token
        )
        return 200, response

    def _list_reservations(
        self, zone: str, _rid: None, query: dict[str, str], _body: bytes
    ) -> tuple[int, Any]:
        page, token = _page(self._reservations.get(zone, []), query, self.page_size)
        return 200, tpu_v2alpha1.ListReservationsResponse(reservations=page,
                                                          next_page_token=token)

    def _list_runtime_versions(
        self, zone: str, _rid: None, query: dict[str, str], _b: bytes
    ) -> tuple[int, Any]:
        versions = [
            tpu_v2.RuntimeVersion(name=self._name(zone, "runtimeVersions", v), version=v)
            for v in self.runtime_versions.get(zone, [])
        ]
        page, token = _page(versions, query, self.page_size)
        response = tpu_v2.ListRuntimeVersionsResponse(runtime_versions=page, next_page_token=token)
        return 200, response

    # ---- internals -----------------------------------------------------------
    def _name(self, zone: str, collection: str, rid: str) -> str:
        return f"projects/{self.project}/locations/{zone}/{collection}/{rid}"

    def _put_node(
        self, zone: str, node_id: str, node: tpu_v2.Node, states: list[str], lock: bool = True
    ) -> None:
        node.state = NodeState[states[0]]
        scripted = _Scripted(node, [NodeState[s] for s in states[1:]])
        if lock:
            with self._lock:
                self._nodes[(zone, node_id)] = scripted
        else:
            self._nodes[(zone, node_id)] = scripted

    def _set_node_state(self, zone: str, rid: str, state: NodeState) -> tuple[int, Any]:
        scripted = self._nodes.get((zone, rid))
        if scripted is None:
            return _not_found("node", zone, rid)
        scripted.message.state = state
        scripted.upcoming = []
        return _done(zone, rid, tpu_v2.Node.pb(scripted.message))

    @staticmethod
    def _read(scripted: _Scripted) -> object:
        if not scripted.upcoming:  # answered under the lock before anything changes it
            return scripted.message
        snapshot = type(scripted.message)(scripted.message)
        scripted.message.state = scripted.upcoming.pop(0)
        return snapshot

    def _read_queued(self, zone: str, scripted: _Scripted) -> tpu_v2.QueuedResource:
        snapshot = tpu_v2.QueuedResource(scripted.message)
        if scripted.upcoming:
            scripted.message.state.state = scripted.upcoming.pop(0)
            if scripted.message.state.state == QueuedState.ACTIVE:
                self._provision(zone, scripted.message)
        return snapshot

    def _provision(self, zone: str, queued: tpu_v2.QueuedResource) -> None:
        for spec in queued.tpu.node_spec:
            node = tpu_v2.Node(spec.node)
            node.name = self._name(zone, "nodes", spec.node_id)
            node.queued_resource = queued.name
            node.create_time = datetime.now(timezone.utc)
            self._put_node(zone, spec.node_id, node, ["READY"], lock=False)


def _action(method: str, rid: str | None) -> str:
    if method == "GET":
        return "get" if rid else "list"
    return {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(method, method.lower())


def _page(items: list, query: dict[str, str], cap: int = 0) -> tuple[list, str]:
    """One page from the offset the token names; the client's pageSize, at most `cap`."""
    start = int(query.get("pageToken") or 0)
    size = int(query.get("pageSize") or 0) or cap or len(items) or 1
    size = min(size, cap) if cap else size
    rest = items[start + size :]
    return items[start : start + size], str(start + size) if rest else ""


def _token_ok(token: str) -> bool:
    return token == "" or token.isdigit()


def _done(zone: str, rid: str, response: object) -> tuple[int, Any]:
    operation = operations_pb2.Operation(
        name=f"projects/-/locations/{zone}/operations/op-{rid}", done=True
    )
    operation.response.Pack(response)
    return 200, json_format.MessageToJson(operation)


def _error(code: int, status: str, message: str,
           details: list[dict[str, Any]] | None = None) -> tuple[int, Any]:
    error: dict[str, Any] = {"code": code, "status": status, "message": message}
    if details:
        error["details"] = details  # google.rpc details as JSON, each with its "@type"
    return code, json.dumps({"error": error})


def _failed_operation(zone: str, rid: str, code: int, message: str) -> tuple[int, Any]:
    """A long-running operation that is done with an error, as a failed create ends
    (`Error code 8, message: There is no more capacity in the zone ...`)."""
    operation = operations_pb2.Operation(
        name=f"projects/-/locations/{zone}/operations/op-{rid}", done=True
    )
    operation.error.code = code
    operation.error.message = message
    return 200, json_format.MessageToJson(operation)


def _not_found(kind: str, zone: str, rid: str) -> tuple[int, Any]:
    return _error(404, "NOT_FOUND", f"{kind} {rid} not found in {zone}")


def _handler_for(api: FakeTpuApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection
        disable_nagle_algorithm = True  # headers and body go out as separate writes

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            with api.serving(self.path):
                if api.latency:
                    time.sleep(api.latency)  # outside the fake's lock: calls overlap
                status, text = api.handle(self.command, self.path, self.rfile.read(length))
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve  # noqa: N815

        def log_message(self, *_args: object) -> None:
            pass

    return Handler


@contextmanager
def running(api: FakeTpuApi) -> Iterator[FakeTpuApi]:
    api.start()
    try:
        yield api
    finally:
        api.stop()


# ---- the same fake over gRPC, the transport TpuClient uses by default -------------------
GRPC_SERVICE = "google.cloud.tpu.v2.Tpu"
# HTTP status -> gRPC status code, as Google APIs map them (google.rpc.Code).
GRPC_CODES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
              503: "UNAVAILABLE"}


def _list_path(collection: str) -> Any:
    def path(request: Any) -> tuple[str, str, bytes]:
        query = urlencode({k: v for k, v in (("pageSize", request.page_size),
                                             ("pageToken", request.page_token)) if v})
        return "GET", f"/v2/{request.parent}/{collection}" + (f"?{query}" if query else ""), b""
    return path


def _grpc_routes() -> dict[str, tuple[Any, Any, Any]]:
    """gRPC method -> (request type, response type, the REST request the fake answers)."""
    guest = tpu_v2.GetGuestAttributesRequest
    return {
        "ListNodes": (tpu_v2.ListNodesRequest, tpu_v2.ListNodesResponse, _list_path("nodes")),
        "ListQueuedResources": (tpu_v2.ListQueuedResourcesRequest,
                                tpu_v2.ListQueuedResourcesResponse,
                                _list_path("queuedResources")),
        "ListAcceleratorTypes": (tpu_v2.ListAcceleratorTypesRequest,
                                 tpu_v2.ListAcceleratorTypesResponse,
                                 _list_path("acceleratorTypes")),
        "ListRuntimeVersions": (tpu_v2.ListRuntimeVersionsRequest,
                                tpu_v2.ListRuntimeVersionsResponse,
                                _list_path("runtimeVersions")),
        "GetNode": (tpu_v2.GetNodeRequest, tpu_v2.Node,
                    lambda r: ("GET", f"/v2/{r.name}", b"")),
        "GetGuestAttributes": (guest, tpu_v2.GetGuestAttributesResponse,
                               lambda r: ("POST", f"/v2/{r.name}:getGuestAttributes",
                                          guest.to_json(r).encode())),
    }


class GrpcFront:
    """`api`'s reads over gRPC on loopback (insecure): `client()` is a TpuClient on the
    gRPC transport. Every call is answered by `api.handle` as its REST twin is, with the
    same latency, overlap records and errors (mapped to gRPC codes)."""

    def __init__(self, api: FakeTpuApi) -> None:
        import grpc

        self.api = api
        handlers = {name: grpc.unary_unary_rpc_method_handler(
            partial(self._answer, route), request_deserializer=request.deserialize,
            response_serializer=bytes)  # the fake answers in wire bytes already
            for name, (request, _response, route) in _grpc_routes().items()}
        self.server = grpc.server(ThreadPoolExecutor(max_workers=64))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(GRPC_SERVICE, handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _answer(self, route: Any, request: Any, context: Any) -> bytes:
        import grpc

        method, path, body = route(request)
        with self.api.serving(path):
            if self.api.latency:
                time.sleep(self.api.latency)
            status, answer = self.api.handle(method, path, body, binary=True)
        if status != 200:
            message = json.loads(answer)["error"]["message"]
            context.abort(getattr(grpc.StatusCode, GRPC_CODES.get(status, "UNKNOWN")), message)
        return answer

    def client(self) -> tpu_v2.TpuClient:
        import grpc
        from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=channel))

    def stop(self) -> None:
        self.server.stop(grace=None)
