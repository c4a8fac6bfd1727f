"""The TPU API as tpuctl sees it: one client, retries, clear errors, a stack's nodes.

A stack's nodes are found with ONE `list_nodes` call per (project, zone) the stack
uses (a team's nodes live in the team's project, docs/teams.md), filtered by the
labels every tpu-stack resource carries (`stack`, `managed-by=pulumi`,
docs/design.md "Labels everywhere"), never one `get` per node.

The (project, zone) pairs are read concurrently (`each_place`), at most
`per_project` requests in flight per project (every call takes its project's slot),
and a pair that cannot be read is one `Unread` beside what the others returned.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Generic, Literal, TypeVar

from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.cloud import tpu_v2
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from cloud import gcp_credentials
from cloud.tpu import ENDPOINT_ENV, tpu_client, transient_retry
from model.naming import MANAGED_BY, label_value

STATUS_NAMESPACE = "tpu-stack"  # docs/design.md: the agent's guest attributes live under tpu-stack/
# Nodes whose guest attributes can be read (a stopped or preempted VM publishes none).
READABLE_STATES = {"READY", "STOPPING"}
STATUS_KEYS = ("state", "step", "package", "message", "updated", "node", "goodput", "lastSave",
               "stopSave", "perf", "phase", "progressAt", "hang")

# The IAM permission each call needs (docs.cloud.google.com/iam/docs/roles-permissions/tpu).
PERMISSIONS = {
    "list_nodes": "tpu.nodes.list",
    "get_node": "tpu.nodes.get",
    "get_guest_attributes": "tpu.nodes.get",
    "delete_node": "tpu.nodes.delete",
    "stop_node": "tpu.nodes.stop",
    "update_node": "tpu.nodes.update",
    "list_accelerator_types": "tpu.acceleratortypes.list",
    "list_runtime_versions": "tpu.runtimeversions.list",
    "get_queued_resource": "tpu.queuedresources.get",
    "list_queued_resources": "tpu.queuedresources.list",
    "create_queued_resource": "tpu.queuedresources.create",
    "delete_queued_resource": "tpu.queuedresources.delete",
    "reset_queued_resource": "tpu.queuedresources.reset",
}


Place = tuple[str, str]  # (project, zone): where the TPU API lists nodes
T = TypeVar("T")

# Requests in flight at once per project. The TPU API's request quota is per project
# and per minute, shared by everyone using the project (cloud.google.com/tpu/docs/quota
# documents chip quotas only; the request figure for tpu.googleapis.com is on the
# console's Quotas page: unconfirmed here), so the bound is a setting. A 429 past it is
# retried with backoff (components/queued_tpu.py, transient_retry).
REQUESTS_PER_PROJECT_ENV = "TPU_STACK_TPU_REQUESTS_PER_PROJECT"
DEFAULT_REQUESTS_PER_PROJECT = 8
# Threads reading (project, zone) pairs at once, over all projects (within each
# project's bound): 100 pairs at 50 ms a request are two rounds.
DEFAULT_IN_FLIGHT = 64

# Why a call failed: `denied` (403) and `no-zone` (a zone the API does not serve for the
# project) stay until someone changes IAM or the stack; `failed` may pass.
Failure = Literal["denied", "no-zone", "failed"]


class TpuApiError(RuntimeError):
    """A TPU API failure reduced to one sentence a person can act on."""

    def __init__(self, message: str, kind: Failure = "failed") -> None:
        super().__init__(message)
        self.kind: Failure = kind


class NoCredentialsError(TpuApiError):
    """No Google credentials on this machine: only offline checks are possible."""


@dataclass(frozen=True)
class NodeStatus:
    """One node as the list call returned it, plus the agent's status if fetched."""

    zone: str
    node_id: str
    state: str
    health: str
    accelerator_type: str
    runtime_version: str
    spot: bool
    labels: dict[str, str]
    metadata: dict[str, str]
    queued_resource: str
    symptoms: tuple[str, ...] = ()
    created: datetime | None = None
    job: dict[str, str] = field(default_factory=dict)
    project: str = ""

    @property
    def name(self) -> str:
        """The node's resource name, as every call on it takes it."""
        return node_name(self.project, self.zone, self.node_id)

    @classmethod
    def from_node(cls, node: tpu_v2.Node) -> NodeStatus:
        # Read from the raw protobuf: proto-plus converts on every attribute read, which
        # cost more than the request itself for a 2,000-node list (bench/status_scale.py).
        pb = tpu_v2.Node.pb(node)
        project, zone, node_id = _parts(pb.name)
        scheduling = pb.scheduling_config
        return cls(
            zone=zone,
            node_id=node_id,
            state=_enum_name(tpu_v2.Node.State, pb.state),
            health=_enum_name(tpu_v2.Node.Health, pb.health) if pb.health else "",
            accelerator_type=pb.accelerator_type,
            runtime_version=pb.runtime_version,
            spot=bool(scheduling.spot or scheduling.preemptible),
            labels=dict(pb.labels),
            metadata=dict(pb.metadata),
            queued_resource=pb.queued_resource,
            symptoms=tuple(
                f"{tpu_v2.Symptom.SymptomType(s.symptom_type).name}: {s.details}".strip(": ")
                for s in pb.symptoms
            ),
            created=pb.create_time.ToDatetime(timezone.utc) if pb.HasField("create_time")
            else None,
            project=project,
        )


@dataclass(frozen=True)
class QueuedStatus:
    """One queued resource: its state and the node ids it provisions."""

    zone: str
    name: str  # projects/<p>/locations/<zone>/queuedResources/<id>
    state: str
    node_ids: tuple[str, ...]
    # FAILED: its `failedData.error` (google.rpc code and message), for the classifier.
    error_code: int = 0
    error_message: str = ""
    created: datetime | None = None
    valid_until: datetime | None = None  # queueingPolicy: validUntilTime, or created + duration
    chips: int = 0  # of every node it asks for: the quota it holds
    accelerator_type: str = ""  # its first node's (a type, or the generation of a config)
    # Its first node's labels (a queued resource has none of its own): whose it is.
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_queued(cls, queued: tpu_v2.QueuedResource) -> QueuedStatus:
        pb = tpu_v2.QueuedResource.pb(queued)
        created = (pb.create_time.ToDatetime(timezone.utc) if pb.HasField("create_time")
                   else None)
        error = pb.state.failed_data.error
        return cls(
            zone=_parts(queued.name)[1],
            name=queued.name,
            state=queued.state.state.name,
            node_ids=tuple(spec.node_id for spec in queued.tpu.node_spec),
            error_code=error.code,
            error_message=error.message,
            created=created,
            valid_until=_valid_until(pb, created),
            chips=sum(_chips(spec.node) for spec in pb.tpu.node_spec),
            accelerator_type=next((_type_of(spec.node) for spec in pb.tpu.node_spec), ""),
            labels=next((dict(spec.node.labels) for spec in pb.tpu.node_spec), {}),
        )


def _valid_until(pb: Any, created: datetime | None) -> datetime | None:
    policy = pb.queueing_policy
    if policy.HasField("valid_until_time"):
        return policy.valid_until_time.ToDatetime(timezone.utc)
    if policy.HasField("valid_until_duration") and created is not None:
        return created + policy.valid_until_duration.ToTimedelta()
    return None


def _type_of(node: Any) -> str:
    if node.accelerator_type:
        return node.accelerator_type
    config = node.accelerator_config
    return f"{tpu_v2.AcceleratorConfig.Type(config.type_).name.lower()} {config.topology}" \
        if config.topology else ""


def _chips(node: Any) -> int:
    """Chips a node asks for (catalog: a type's chips, or a topology's product)."""
    from model import catalog

    if node.accelerator_type:
        try:
            return catalog.parse_accelerator_type(node.accelerator_type).chips
        except catalog.CatalogError:
            return 0
    chips = 1
    for side in (node.accelerator_config.topology or "0").split("x"):
        chips *= int(side) if side.isdigit() else 0
    return chips


@dataclass(frozen=True, order=True)
class Unread:
    """A (project, zone) pair the TPU API could not be read at, and why."""

    project: str
    zone: str
    error: str
    kind: Failure = "failed"

    @property
    def lasting(self) -> bool:
        """Waiting does not fix it: a permission or a zone the API does not serve."""
        return self.kind != "failed"


@dataclass(frozen=True)
class Read(Generic[T]):
    """What the pairs that could be read returned, and one `Unread` per pair that could not."""

    items: list[T]
    unread: list[Unread] = field(default_factory=list)

    def complete(self) -> list[T]:
        """The items when every pair was read, else the first pair's TpuApiError."""
        if self.unread:
            first = self.unread[0]
            more = f" (and {len(self.unread) - 1} more (project, zone) pairs)" \
                if len(self.unread) > 1 else ""
            raise TpuApiError(first.error + more, first.kind)
        return self.items


def requests_per_project(env: Mapping[str, str] | None = None) -> int:
    """`$TPU_STACK_TPU_REQUESTS_PER_PROJECT`, else the default; one clear message if bad."""
    text = (os.environ if env is None else env).get(REQUESTS_PER_PROJECT_ENV, "").strip()
    if not text:
        return DEFAULT_REQUESTS_PER_PROJECT
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise TpuApiError(f"{REQUESTS_PER_PROJECT_ENV}={text!r}: use a whole number of "
                          f"requests in flight per project, 1 or more "
                          f"(default {DEFAULT_REQUESTS_PER_PROJECT})")
    return int(text)


def interleaved(places: Iterable[Place]) -> list[Place]:
    """Each project's first zone, then each one's second, ...: consecutive reads go to
    different projects, so a project's bound holds back no other project's reads."""
    by_project: dict[str, list[str]] = {}
    for project, zone in sorted(set(places)):
        by_project.setdefault(project, []).append(zone)
    depth = max((len(zones) for zones in by_project.values()), default=0)
    return [(project, zones[rank]) for rank in range(depth)
            for project, zones in by_project.items() if rank < len(zones)]


@lru_cache(maxsize=256)
def _enum_name(enum: Any, value: int) -> str:
    """An enum value's name, looked up once (10,000 nodes make 20,000 lookups)."""
    return enum(value).name


def _parts(name: str) -> tuple[str, str, str]:
    # projects/<p>/locations/<zone>/nodes/<id>: (p, zone, id)
    parts = name.split("/")
    return parts[1], parts[3], parts[5]


def parent(project: str, zone: str) -> str:
    return f"projects/{project}/locations/{zone}"


def node_name(project: str, zone: str, node_id: str) -> str:
    return f"{parent(project, zone)}/nodes/{node_id}"


def _project_of(request: dict[str, Any]) -> str:
    """The project of a request's `parent` or `name` (`projects/<p>/...`), for messages."""
    parts = str(request.get("parent") or request.get("name") or "").split("/")
    return parts[1] if len(parts) > 1 and parts[0] == "projects" else "?"


class TpuApi:
    """The calls tpuctl makes, each retried and each failing with one clear message.

    Not bound to a project: every call names its project (`parent`, `name`), so one
    client serves a stack whose nodes span the team projects. `auth`: the stack's gcp
    credentials (StackTarget.auth), as its gcp provider uses them.

    One client serves every thread: google-cloud-python's generated client docs say "it
    is safe to share instances across threads" (multiprocessing.rst, included by
    packages/google-cloud-tpu/docs/index.rst; docs/tpu-facts.md); the REST transport's
    requests/urllib3 pool is thread-safe too (googleapis/google-cloud-python PR 5763).
    `per_project`:
    requests in flight per project (default: requests_per_project()); `in_flight`:
    threads reading pairs at once.
    """

    def __init__(
        self,
        client: tpu_v2.TpuClient | None = None,
        deadline: float = 60.0,
        auth: gcp_credentials.GcpAuth | None = None,
        per_project: int | None = None,
        in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> None:
        self._client = client
        self._auth = auth
        self._retry = transient_retry(deadline)
        self._credentials: Any = None  # the google.auth credentials, until checked once
        self.per_project = per_project or requests_per_project()
        self.in_flight = in_flight
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    @property
    def client(self) -> tpu_v2.TpuClient:
        with self._lock:  # threads share one client: make it once
            return self._make_client()

    def _make_client(self) -> tpu_v2.TpuClient:
        if self._client is None:
            try:
                if not os.environ.get(ENDPOINT_ENV):
                    self._credentials = (gcp_credentials.build(self._auth) if self._auth
                                         else gcp_credentials.stack_credentials())
                self._client = tpu_client(self._auth, self._credentials)
            except gcp_credentials.NoUsableCredentialsError as error:
                raise NoCredentialsError(str(error)) from None
            except auth_exceptions.DefaultCredentialsError:
                raise NoCredentialsError(
                    gcp_credentials.no_credentials_message(os.environ)) from None
            except gcp_credentials.GcpCredentialsError as error:
                raise TpuApiError(str(error)) from None
        return self._client

    def _refreshed(self) -> None:
        """Refresh the credentials once, before the first call: an expired login or a
        revoked key would otherwise reach gRPC as a 503 ("Getting metadata from plugin
        failed") that is retried until the deadline."""
        with self._refresh_lock:  # threads share them: the first refreshes, the rest wait
            credentials = self._credentials
            if credentials is not None and not credentials.valid:
                self._refresh(credentials)  # raises, and every later call raises the same
            self._credentials = None

    def _refresh(self, credentials: Any) -> None:
        from google.auth.transport.requests import Request

        auth = self._auth or gcp_credentials.resolve({}, os.environ)
        try:
            credentials.refresh(Request())
        except auth_exceptions.RefreshError as error:
            raise NoCredentialsError(
                gcp_credentials.refresh_message(auth, os.environ, error)) from None
        except auth_exceptions.TransportError as error:
            raise TpuApiError(f"could not reach Google to refresh the credentials from "
                              f"{gcp_credentials.describe(auth, os.environ)}: {error}") from None

    def call(self, method: str, target: str, wait: float | None = None, **request: Any) -> Any:
        """`client.<method>(**request)`, retried, every failure explained in one sentence.

        `target` names the zone or node in messages. Lists are drained here and
        operations awaited here (`wait` seconds), so later pages fail the same way.
        """
        function: Callable[..., Any] = getattr(self.client, method)
        project = _project_of(request)
        self._refreshed()
        with self._explained(method, target, project):
            with self._slot(project):
                result = function(request=request, retry=self._retry)
                if method.startswith("list_"):
                    return list(result)  # the pager asks for every next_page_token
            return result.result(timeout=wait) if wait is not None else result

    @contextmanager
    def _slot(self, project: str) -> Iterator[None]:
        """Hold one of the project's `per_project` slots for a request (and its pages)."""
        with self._lock:
            slot = self._slots.setdefault(project, threading.BoundedSemaphore(self.per_project))
        with slot:
            yield

    def each_place(self, places: Iterable[Place], read: Callable[[str, str], T]
                   ) -> tuple[dict[Place, T], list[Unread]]:
        """`read(project, zone)` for every pair, concurrently; a pair whose read fails is
        one Unread, the others still count. No credentials fails the whole walk."""
        ordered = interleaved(places)
        if not ordered:
            return {}, []
        self.client  # noqa: B018 - made once, before the threads; NoCredentialsError here
        with ThreadPoolExecutor(max_workers=min(self.in_flight, len(ordered))) as pool:
            futures = {place: pool.submit(read, *place) for place in ordered}
        found, unread = {}, []
        for (project, zone), future in futures.items():
            try:
                found[(project, zone)] = future.result()
            except NoCredentialsError:
                raise
            except TpuApiError as error:
                unread.append(Unread(project, zone, str(error), error.kind))
        return found, sorted(unread)

    @contextmanager
    def _explained(self, method: str, target: str, project: str) -> Iterator[None]:
        try:
            yield
        except (gexc.PermissionDenied, gexc.Forbidden) as error:  # gRPC / REST spelling of 403
            permission = PERMISSIONS.get(method, "a tpu.* permission")
            raise TpuApiError(
                f"permission denied: {method} on {target} in project {project} needs "
                f"IAM permission {permission} (e.g. roles/tpu.viewer or roles/tpu.admin)",
                "denied",
            ) from error
        except gexc.NotFound as error:
            if "Location" in str(error.message):
                raise TpuApiError(
                    f"zone {target!r} is unknown to the TPU API for project {project}: "
                    f"{error.message}", "no-zone",
                ) from error
            raise TpuApiError(f"{method}: {target} not found ({error.message})") from error
        except gexc.RetryError as error:
            raise TpuApiError(
                f"{method} on {target}: the TPU API kept failing ({error.cause})"
            ) from error
        except gexc.GoogleAPICallError as error:
            raise TpuApiError(
                f"{method} on {target} failed: {error.code} {error.message}"
            ) from error
        except (json_format.ParseError, DecodeError) as error:  # an answer cut short
            raise TpuApiError(
                f"{method} on {target}: the TPU API's answer could not be read ({error})"
            ) from error

    # ---- reads ---------------------------------------------------------------
    def list_nodes(self, project: str, zone: str) -> list[tpu_v2.Node]:
        return self.call("list_nodes", zone, parent=parent(project, zone))

    def read_nodes(self, places: Iterable[Place], stack: str) -> Read[NodeStatus]:
        """Every node of `stack` at `places` (project, zone): one list per place (every
        page of it), the places concurrently; an Unread per place that failed."""

        def listed(project: str, zone: str) -> list[NodeStatus]:
            # Labels filtered on the plain dict: proto-plus wraps a map on every read.
            return [status for status in map(NodeStatus.from_node, self.list_nodes(project, zone))
                    if belongs_to(status.labels, stack)]

        found, unread = self.each_place(places, listed)
        nodes = [node for place_nodes in found.values() for node in place_nodes]
        return Read(sorted(nodes, key=lambda n: (n.zone, n.node_id, n.project)), unread)

    def stack_nodes(self, places: Iterable[Place], stack: str) -> list[NodeStatus]:
        """read_nodes, all or nothing: TpuApiError if any place could not be read."""
        return self.read_nodes(places, stack).complete()

    def read_queued(self, places: Iterable[Place], node_ids: Iterable[str]
                    ) -> Read[QueuedStatus]:
        """Queued resources (they carry no labels) that provision any of `node_ids`:
        one list per (project, zone), the places concurrently."""
        wanted = set(node_ids)

        def listed(project: str, zone: str) -> list[QueuedStatus]:
            queued = self.call("list_queued_resources", zone, parent=parent(project, zone))
            return [q for q in map(QueuedStatus.from_queued, queued) if wanted & set(q.node_ids)]

        found, unread = self.each_place(places, listed)
        return Read(sorted((q for items in found.values() for q in items),
                           key=lambda q: q.name), unread)

    def stack_queued(self, places: Iterable[Place], node_ids: Iterable[str]) -> list[QueuedStatus]:
        return self.read_queued(places, node_ids).complete()

    def job_status(self, node: NodeStatus) -> dict[str, str]:
        """The agent's status from worker 0's guest attributes (`tpu-stack/<key>`), or {}."""
        response = self.call(
            "get_guest_attributes",
            node.node_id,
            name=node.name,
            query_path=f"{STATUS_NAMESPACE}/",
            # Worker 0 runs the job (a pod's other workers are idle); the API
            # promises no order for all workers (GetGuestAttributesRequest.worker_ids).
            worker_ids=["0"],
        )
        return parse_guest_attributes(response)

    def with_job_status(self, nodes: list[NodeStatus], workers: int = 8) -> list[NodeStatus]:
        """Nodes with `job` filled in; guest attributes are per node, so fetched concurrently.

        At most `workers` calls in flight, and `per_project` per project (REQUESTS_PER_
        PROJECT_ENV). status.py asks here only for nodes whose status the logs bucket's
        one listing lacks."""
        readable = [n for n in nodes if n.state in READABLE_STATES]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            statuses = dict(
                zip(
                    [(n.node_id, n.zone) for n in readable],
                    pool.map(self.job_status, readable),
                    strict=True,
                )
            )
        return [replace(n, job=statuses.get((n.node_id, n.zone), {})) for n in nodes]

    def accelerator_types(self, project: str, zone: str) -> set[str]:
        types = self.call("list_accelerator_types", zone, parent=parent(project, zone))
        return {item.type_ for item in types}

    def runtime_versions(self, project: str, zone: str) -> set[str]:
        versions = self.call("list_runtime_versions", zone, parent=parent(project, zone))
        return {item.version for item in versions}

    # ---- changes -------------------------------------------------------------
    def delete_node(self, name: str, timeout: float = 600.0) -> None:
        """Delete the node `name` (`projects/<p>/locations/<zone>/nodes/<id>`)."""
        self.call("delete_node", _parts(name)[2], wait=timeout, name=name)

    def stop_node(self, name: str, timeout: float = 600.0) -> None:
        self.call("stop_node", _parts(name)[2], wait=timeout, name=name)

    def reset_queued_resource(self, queued_resource: str, timeout: float = 600.0) -> None:
        self.call("reset_queued_resource", queued_resource, wait=timeout, name=queued_resource)

    def delete_queued_resource(self, queued_resource: str, timeout: float = 600.0) -> None:
        """Delete a request in any state, its nodes first (force), and wait until it is gone
        (components/queued_tpu.py force_delete)."""
        from components.queued_tpu import force_delete

        force_delete(self.client, queued_resource, timeout, poll=2.0)

    def move_queued_resource(self, queued_resource: str, placement: Mapping[str, Any],
                             timeout: float = 600.0) -> str:
        """The request's node, queued again at `placement` (a candidate's, components/
        fallback_tpu.py): the old request is deleted and confirmed gone first, so at most
        one is alive. Returns the new request's name."""
        from components import fallback_tpu

        old = self.call("get_queued_resource", queued_resource, name=queued_resource)
        props = fallback_tpu.props_from_request(old, placement)
        if placement.get("queued_resource_id"):  # the candidate's own request name
            props["queued_resource_id"] = placement["queued_resource_id"]
        self.delete_queued_resource(queued_resource, timeout)
        return fallback_tpu.enqueue(self.client, props, timeout)


def belongs_to(labels: Any, stack: str) -> bool:
    """Carries the labels model/naming.py gives every resource of `stack`."""
    return labels.get("stack") == label_value(stack) and labels.get("managed-by") == MANAGED_BY


def parse_guest_attributes(response: tpu_v2.GetGuestAttributesResponse) -> dict[str, str]:
    """Worker 0's `tpu-stack/` keys (the request asked for worker 0 alone)."""
    for worker in response.guest_attributes[:1]:
        return {
            item.key: item.value
            for item in worker.query_value.items
            if item.namespace == STATUS_NAMESPACE and item.key in STATUS_KEYS
        }
    return {}
