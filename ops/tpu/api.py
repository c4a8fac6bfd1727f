"""The TPU API as tpuctl sees it: one client, retries, clear errors, a stack's nodes.

A stack's nodes are found with ONE `list_nodes` call per (project, zone) the stack
uses (a team's nodes live in the team's project, docs/teams.md), filtered by the
labels every tpu-stack resource carries (`stack`, `managed-by=pulumi`,
docs/design.md "Labels everywhere"), never one `get` per node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.cloud import tpu_v2

from components import gcp_credentials
from components.naming import MANAGED_BY, label_value
from components.queued_tpu import tpu_client, transient_retry

STATUS_NAMESPACE = "tpu-stack"  # docs/design.md: the agent's guest attributes live under tpu-stack/
# Nodes whose guest attributes can be read (a stopped or preempted VM publishes none).
READABLE_STATES = {"READY", "STOPPING"}
STATUS_KEYS = ("state", "step", "package", "message", "updated", "node", "goodput", "lastSave",
               "stopSave", "phase", "progressAt", "hang")

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


class TpuApiError(RuntimeError):
    """A TPU API failure reduced to one sentence a person can act on."""


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
            state=tpu_v2.Node.State(pb.state).name,
            health=tpu_v2.Node.Health(pb.health).name if pb.health else "",
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

    @classmethod
    def from_queued(cls, queued: tpu_v2.QueuedResource) -> QueuedStatus:
        return cls(
            zone=_parts(queued.name)[1],
            name=queued.name,
            state=queued.state.state.name,
            node_ids=tuple(spec.node_id for spec in queued.tpu.node_spec),
        )


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
    """

    def __init__(
        self,
        client: tpu_v2.TpuClient | None = None,
        deadline: float = 60.0,
        auth: gcp_credentials.GcpAuth | None = None,
    ) -> None:
        self._client = client
        self._auth = auth
        self._retry = transient_retry(deadline)

    @property
    def client(self) -> tpu_v2.TpuClient:
        if self._client is None:
            try:
                self._client = tpu_client(self._auth)
            except auth_exceptions.DefaultCredentialsError as error:
                raise NoCredentialsError(
                    "no Google credentials: run `gcloud auth application-default login` "
                    "or set GOOGLE_APPLICATION_CREDENTIALS"
                ) from error
            except gcp_credentials.GcpCredentialsError as error:
                raise TpuApiError(str(error)) from None
        return self._client

    def call(self, method: str, target: str, wait: float | None = None, **request: Any) -> Any:
        """`client.<method>(**request)`, retried, every failure explained in one sentence.

        `target` names the zone or node in messages. Lists are drained here and
        operations awaited here (`wait` seconds), so later pages fail the same way.
        """
        function: Callable[..., Any] = getattr(self.client, method)
        with self._explained(method, target, _project_of(request)):
            result = function(request=request, retry=self._retry)
            if method.startswith("list_"):
                return list(result)
            return result.result(timeout=wait) if wait is not None else result

    @contextmanager
    def _explained(self, method: str, target: str, project: str) -> Iterator[None]:
        try:
            yield
        except (gexc.PermissionDenied, gexc.Forbidden) as error:  # gRPC / REST spelling of 403
            permission = PERMISSIONS.get(method, "a tpu.* permission")
            raise TpuApiError(
                f"permission denied: {method} on {target} in project {project} needs "
                f"IAM permission {permission} (e.g. roles/tpu.viewer or roles/tpu.admin)"
            ) from error
        except gexc.NotFound as error:
            if "Location" in str(error.message):
                raise TpuApiError(
                    f"zone {target!r} is unknown to the TPU API for project {project}: "
                    f"{error.message}"
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

    # ---- reads ---------------------------------------------------------------
    def list_nodes(self, project: str, zone: str) -> list[tpu_v2.Node]:
        return self.call("list_nodes", zone, parent=parent(project, zone))

    def stack_nodes(self, places: Iterable[Place], stack: str) -> list[NodeStatus]:
        """Every node of `stack` at `places` (project, zone): one list call per place."""
        found: list[NodeStatus] = []
        for project, zone in sorted(set(places)):
            found += [
                NodeStatus.from_node(n)
                for n in self.list_nodes(project, zone)
                if belongs_to(n.labels, stack)
            ]
        return sorted(found, key=lambda n: (n.zone, n.node_id, n.project))

    def stack_queued(self, places: Iterable[Place], node_ids: Iterable[str]) -> list[QueuedStatus]:
        """Queued resources (they carry no labels) that provision any of `node_ids`:
        one list call per (project, zone)."""
        wanted = set(node_ids)
        found = []
        for project, zone in sorted(set(places)):
            listed = self.call("list_queued_resources", zone, parent=parent(project, zone))
            found += [q for q in map(QueuedStatus.from_queued, listed) if wanted & set(q.node_ids)]
        return found

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

        At most `workers` calls in flight: the TPU API limits requests per minute per
        project (cloud.google.com/tpu/docs/quota; the default figure for
        tpu.googleapis.com is shown on the console's Quotas page, not on that page:
        unconfirmed), and every user of the project shares it. status.py asks here
        only for nodes whose status the logs bucket's one listing lacks."""
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


def belongs_to(labels: Any, stack: str) -> bool:
    """Carries the labels components/naming.py gives every resource of `stack`."""
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
