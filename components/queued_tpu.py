"""A queued TPU that boots into a job: a Pulumi dynamic resource over google-cloud-tpu.

`gcp.tpu.V2QueuedResource` carries no metadata, service account or spot flag, so
a queued TPU built with it cannot run the agent. The API itself takes a full
`Node` inside a queued resource (docs/tpu-facts.md, "The API and the resources"), so
this provider sends one with `tpu_v2.TpuClient.create_queued_resource`.

The provider is serialised by dill into the Pulumi state: it holds no client and
no attributes; every method builds its client lazily. `TPU_STACK_TPU_ENDPOINT`
(an `http://host:port` URL) aims the client at a fake API with anonymous
credentials, for tests.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any

import pulumi
import pulumi.dynamic as dyn

from cloud import gcp_credentials
from cloud.tpu import tpu_client, transient_retry
from model.pulumi_types import DYNAMIC_MODULE, QUEUED_TPU_NAME

# Node fields the API updates in place; any other change replaces the node
# (magic-modules mmv1/products/tpuv2/Vm.yaml, docs/tpu-facts.md). data_disks is not an input here.
IN_PLACE = ("metadata", "labels", "tags", "description")
# Inputs that only steer this provider (no cloud field): changing them is a no-op update.
PROVIDER_ONLY = ("create_timeout_seconds", "delete_timeout_seconds", "poll_seconds")
# Node maps that others write to as well: `gcloud compute tpus tpu-vm ssh` adds ssh-keys.
MAPS = ("metadata", "labels")
DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# AcceleratorConfig.Type names in google-cloud-tpu 1.27 (docs/tpu-facts.md).
CONFIG_TYPES = ("V2", "V3", "V4", "V5LITE_POD", "V5P", "V6E")


class QueuedTpuError(RuntimeError):
    """A queued TPU reached a state it cannot leave by itself, or ran out of time."""


# ---- building the request ----------------------------------------------------


def check_inputs(props: dict[str, Any]) -> list[tuple[str, str]]:
    """Every problem with the inputs as (input, what is allowed)."""
    problems = [
        (key, "is required")
        for key in ("project", "zone", "node_id", "runtime_version")
        if not props.get(key)
    ]
    has_type = bool(props.get("accelerator_type"))
    has_config = bool(props.get("accelerator_topology") or props.get("accelerator_config_type"))
    if has_type == has_config:
        problems.append(
            (
                "accelerator_type",
                "give it, or accelerator_topology with accelerator_config_type (not both)",
            )
        )
    if has_config and props.get("accelerator_config_type") not in CONFIG_TYPES:
        problems.append(("accelerator_config_type", f"must be one of {', '.join(CONFIG_TYPES)}"))
    if has_config and not props.get("accelerator_topology"):
        problems.append(("accelerator_topology", "is required with accelerator_config_type"))
    if props.get("spot") and (props.get("guaranteed") or props.get("reservation_name")):
        problems.append(
            (
                "spot",
                "cannot be combined with guaranteed or reservation_name "
                "(one tier per queued resource)",
            )
        )
    if int(props.get("valid_until_seconds") or 0) < 0:
        problems.append(("valid_until_seconds", "must be positive"))
    return problems


def build_node(props: dict[str, Any]) -> Any:
    from google.cloud import tpu_v2

    node = tpu_v2.Node(
        runtime_version=props["runtime_version"],
        description=props.get("description") or "",
        network_config=tpu_v2.NetworkConfig(
            network=props.get("network") or "",
            subnetwork=props.get("subnetwork") or "",
            enable_external_ips=bool(props.get("enable_external_ips")),
        ),
        metadata=props.get("metadata") or {},
        labels=props.get("labels") or {},
        tags=props.get("tags") or [],
    )
    if props.get("accelerator_type"):
        node.accelerator_type = props["accelerator_type"]
    else:
        node.accelerator_config = tpu_v2.AcceleratorConfig(
            type_=tpu_v2.AcceleratorConfig.Type[props["accelerator_config_type"]],
            topology=props["accelerator_topology"],
        )
    if props.get("service_account_email"):
        node.service_account = tpu_v2.ServiceAccount(
            email=props["service_account_email"], scope=list(props.get("scopes") or DEFAULT_SCOPES)
        )
    return node


def build_queued_resource(props: dict[str, Any]) -> Any:
    from google.cloud import tpu_v2

    qr = tpu_v2.QueuedResource
    spec = qr.Tpu.NodeSpec(parent=_parent(props), node_id=props["node_id"], node=build_node(props))
    queued = qr(tpu=qr.Tpu(node_spec=[spec]))
    if props.get("spot"):
        queued.spot = qr.Spot()
    elif props.get("guaranteed"):
        queued.guaranteed = qr.Guaranteed()
    if props.get("reservation_name"):
        queued.reservation_name = _reservation(props)
    if props.get("valid_until_seconds"):
        seconds = int(props["valid_until_seconds"])
        queued.queueing_policy = qr.QueueingPolicy(valid_until_duration=timedelta(seconds=seconds))
    return queued


def _parent(props: dict[str, Any]) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}"


def _queued_id(props: dict[str, Any]) -> str:
    return props.get("queued_resource_id") or props["node_id"]


def _reservation(props: dict[str, Any]) -> str:
    # projects/{project}/locations/{zone}/reservations/{reservation} (QueuedResource docstring).
    name = props["reservation_name"]
    return name if "/" in name else f"{_parent(props)}/reservations/{name}"


# ---- waiting -------------------------------------------------------------------

# States of a request that sits in the queue or got its capacity: `create` returns at
# the first of them, `read` and `tpuctl wait` follow the rest. WAITING_FOR_RESOURCES
# replaced ACCEPTED (cloud.google.com/tpu/docs/queued-resources, request states).
IN_QUEUE = frozenset({"WAITING_FOR_RESOURCES", "ACCEPTED", "PROVISIONING", "ACTIVE"})


def _state_name(queued: Any) -> str:
    return queued.state.state.name


def _failure_detail(queued: Any) -> str:
    error = queued.state.failed_data.error
    return f": {error.message}" if error and error.message else ""


def wait_for_queued(
    client: Any, name: str, wanted: set[str] | frozenset[str], timeout: float, poll: float
) -> Any:
    """Poll a queued resource until its state is in `wanted`.

    FAILED and SUSPENDED end the wait with a QueuedTpuError unless wanted; so do
    a vanished request and the deadline."""
    from google.api_core import exceptions as gexc

    deadline = time.monotonic() + timeout
    while True:
        try:
            queued = client.get_queued_resource(name=name, retry=transient_retry())
        except gexc.NotFound:
            raise QueuedTpuError(
                f"queued resource {name} disappeared while waiting for {sorted(wanted)}"
            ) from None
        state = _state_name(queued)
        if state in wanted:
            return queued
        if state == "FAILED":
            raise QueuedTpuError(f"queued resource {name} FAILED{_failure_detail(queued)}")
        if state == "SUSPENDED":
            raise QueuedTpuError(
                f"queued resource {name} is SUSPENDED (its node was deleted or preempted): "
                "run `tpuctl recover --apply`, then `pulumi up --refresh`"
            )
        if time.monotonic() >= deadline:
            raise QueuedTpuError(
                f"queued resource {name} is still {state} after {timeout:.0f} s "
                f"(wanted {'/'.join(sorted(wanted))})"
            )
        time.sleep(poll)


def wait_until_gone(client: Any, name: str, timeout: float, poll: float) -> None:
    from google.api_core import exceptions as gexc

    deadline = time.monotonic() + timeout
    while True:
        try:
            queued = client.get_queued_resource(name=name, retry=transient_retry())
        except gexc.NotFound:
            return
        if time.monotonic() >= deadline:
            raise QueuedTpuError(
                f"queued resource {name} is still {_state_name(queued)} {timeout:.0f} s "
                "after its deletion"
            )
        time.sleep(poll)


def force_delete(client: Any, name: str, timeout: float, poll: float) -> None:
    """Delete a queued resource in any state, its nodes first; done when it is gone.

    Without `force` the API deletes a request only once its nodes are gone or it is
    ACCEPTED, FAILED or SUSPENDED; with `force` it deletes the running nodes first
    (google-cloud-tpu 1.27, `tpu_v2.DeleteQueuedResourceRequest.force`). So a request
    still WAITING_FOR_RESOURCES, PROVISIONING or CREATING needs it."""
    from google.api_core import exceptions as gexc
    from google.cloud import tpu_v2

    request = tpu_v2.DeleteQueuedResourceRequest(name=name, force=True)
    with contextlib.suppress(gexc.NotFound):
        client.delete_queued_resource(request=request, retry=transient_retry()).result(
            timeout=timeout
        )
    wait_until_gone(client, name, timeout, poll)


# ---- the provider ----------------------------------------------------------------


class QueuedTpuProvider(dyn.ResourceProvider):
    """create/read/diff/update/delete for one queued resource holding one node.

    A dynamic provider's failed `create` records nothing in the state (Pulumi's
    dynamic provider contract: no partial state, docs/tpu-facts.md). A request left
    in the queue would later provision a billable TPU that no stack owns, so every
    failure after the create call deletes the request (force) before it is raised,
    and `create` returns as soon as the request is in the queue: provisioning is
    followed by `read` (`pulumi refresh`) and `tpuctl wait`, never by a long wait here."""

    def configure(self, req: dyn.ConfigureRequest) -> None:
        # The stack config, for the gcp provider's credentials (tpu_client).
        gcp_credentials.use_stack_config(req.config)

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dyn.CheckResult:
        failures = [dyn.CheckFailure(key, f"{key} {why}") for key, why in check_inputs(news)]
        return dyn.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        problems = check_inputs(props)
        if problems:
            raise QueuedTpuError("; ".join(f"{key} {why}" for key, why in problems))
        client = tpu_client()
        name = f"{_parent(props)}/queuedResources/{_queued_id(props)}"
        try:
            queued = _enqueue(client, name, props)
        except Exception as error:
            raise _cleaned_up(client, name, props, error) from error
        return dyn.CreateResult(name, _outputs(client, props, queued))

    def read(self, id_: str, props: dict[str, Any]) -> dyn.ReadResult:
        from google.api_core import exceptions as gexc

        client = tpu_client()
        try:
            queued = client.get_queued_resource(name=id_, retry=transient_retry())
        except gexc.NotFound:
            return dyn.ReadResult("", {})  # gone: Pulumi drops it and the next `up` recreates it
        return dyn.ReadResult(id_, _outputs(client, props, queued))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        # `olds` are the last outputs: for a held change (update), what the node or
        # its request carries, so the change shows again until it is applied.
        changed = [
            key
            for key in _input_keys(olds, news)
            if _normal(olds.get(key)) != _normal(news.get(key))
        ]
        replaces = [key for key in changed if key not in IN_PLACE + PROVIDER_ONLY]
        # Node and queued-resource ids are fixed names: the old one must go first.
        return dyn.DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=True)

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        from google.api_core import exceptions as gexc
        from google.protobuf import field_mask_pb2

        client = tpu_client()
        applied = news
        paths = _in_place_changes(olds, news)
        if paths:
            try:
                current = client.get_node(name=_node_name(news), retry=transient_retry())
            except gexc.NotFound:
                # Not provisioned yet. The API cannot patch the node spec inside a
                # request, and queueing it again would lose its place in the queue, so
                # the change is held: the outputs keep what the request carries, and
                # the next `up` once the node exists diffs the inputs against them and
                # patches the node (a dynamic provider's diff and update get the old
                # *outputs* as olds: pulumi/pulumi proto/pulumi/provider.proto,
                # DiffRequest.olds and UpdateRequest.olds).
                applied = _held(olds, news, paths)
            else:
                node = build_node(news)
                node.name = current.name
                for key in MAPS:
                    merged = _merged(getattr(current, key), olds.get(key), news.get(key))
                    getattr(node, key).clear()
                    getattr(node, key).update(merged)
                client.update_node(
                    node=node,
                    update_mask=field_mask_pb2.FieldMask(paths=paths),
                    retry=transient_retry(),
                ).result(timeout=_timeout(news, "create"))
        queued = client.get_queued_resource(name=id_, retry=transient_retry())
        return dyn.UpdateResult(_outputs(client, applied, queued))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        # One call ends the request in any state, WAITING_FOR_RESOURCES, PROVISIONING
        # and CREATING included, and deletes its node first (force_delete).
        force_delete(tpu_client(), id_, _timeout(props, "delete"), _poll(props))


def _enqueue(client: Any, name: str, props: dict[str, Any]) -> Any:
    """Send the request; return it once it is in the queue (IN_QUEUE)."""
    from google.api_core import exceptions as gexc

    # 409 ALREADY_EXISTS: a request of this name that an earlier run could not
    # clean up; it is this node's (the id carries stack and node), so adopt it.
    with contextlib.suppress(gexc.Conflict):
        client.create_queued_resource(
            parent=_parent(props),
            queued_resource_id=_queued_id(props),
            queued_resource=build_queued_resource(props),
            retry=transient_retry(),
        ).result(timeout=_timeout(props, "create"))
    return wait_for_queued(client, name, IN_QUEUE, _timeout(props, "create"), _poll(props))


def _cleaned_up(client: Any, name: str, props: dict[str, Any], error: Exception) -> Exception:
    """Delete (force) the request `error` interrupted; the error to raise, saying so."""
    try:
        force_delete(client, name, _timeout(props, "delete"), _poll(props))
    except Exception as cleanup:  # reported, with the command that finishes the job
        zone, queued_id = props["zone"], _queued_id(props)
        return QueuedTpuError(
            f"{error}; deleting the request failed too ({cleanup}): it may still be queued "
            f"and provision a TPU no stack owns. Delete it with `gcloud compute tpus "
            f"queued-resources delete {queued_id} --zone {zone} --force`"
        )
    return QueuedTpuError(f"{error}; the request {name} was deleted, nothing is left queued")


def _outputs(client: Any, props: dict[str, Any], queued: Any) -> dict[str, Any]:
    from google.api_core import exceptions as gexc

    outs = {
        **props,
        "state": _state_name(queued),
        "queued_resource_name": queued.name,
        "node_name": "",
        "held": list(props.get("held") or []),
    }
    outs["node_state"] = ""
    try:
        node = client.get_node(name=_node_name(props), retry=transient_retry())
    except gexc.NotFound:
        return outs
    outs.update(node_name=node.name, node_state=node.state.name, tags=list(node.tags))
    for key in MAPS:  # drift in the keys we manage; keys others added are not ours
        outs[key] = {k: v for k, v in getattr(node, key).items() if k in (props.get(key) or {})}
    return outs


def _in_place_changes(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    return [key for key in IN_PLACE if _normal(olds.get(key)) != _normal(news.get(key))]


def _held(olds: dict[str, Any], news: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """`news`, but with the in-place fields the request still carries, and which wait."""
    return {**news, **{key: olds.get(key) for key in IN_PLACE}, "held": sorted(paths)}


def _merged(current: Any, olds: Any, news: Any) -> dict[str, str]:
    """`news` for the keys we manage; keys someone else added (gcloud's ssh-keys) stay."""
    ours = set(olds or {}) | set(news or {})
    return {**{k: v for k, v in current.items() if k not in ours}, **(news or {})}


def _node_name(props: dict[str, Any]) -> str:
    return f"{_parent(props)}/nodes/{props['node_id']}"


def _timeout(props: dict[str, Any], phase: str) -> float:
    return float(props.get(f"{phase}_timeout_seconds") or 3600)


def _poll(props: dict[str, Any]) -> float:
    return float(props.get("poll_seconds") or 15)


def _input_keys(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    outputs_only = {"state", "node_name", "node_state", "queued_resource_name", "held",
                    "__provider"}
    return sorted((set(olds) | set(news)) - outputs_only)


def _normal(value: Any) -> Any:
    """None, '' and empty collections are all 'unset'."""
    return value if value not in (None, "", [], {}) else None


class QueuedTpu(dyn.Resource, module=DYNAMIC_MODULE, name=QUEUED_TPU_NAME):
    """A TPU node requested through a queued resource, carrying the agent's metadata.

    Outputs: state (queued-resource state), queued_resource_name, node_name, node_state,
    held (in-place fields changed while the request waits: applied once the node exists);
    `up` returns once the request is queued, `pulumi refresh` updates them.
    """

    state: pulumi.Output[str]
    queued_resource_name: pulumi.Output[str]
    node_name: pulumi.Output[str]
    node_state: pulumi.Output[str]
    held: pulumi.Output[list[str]]

    def __init__(
        self,
        resource_name: str,
        *,
        project: pulumi.Input[str],
        zone: str,
        node_id: str,
        runtime_version: str,
        queued_resource_id: str | None = None,
        accelerator_type: str | None = None,
        accelerator_topology: str | None = None,
        accelerator_config_type: str | None = None,
        network: pulumi.Input[str] | None = None,
        subnetwork: pulumi.Input[str] | None = None,
        enable_external_ips: bool = False,
        service_account_email: pulumi.Input[str] | None = None,
        scopes: list[str] | None = None,
        metadata: pulumi.Input[dict[str, pulumi.Input[str]]] | None = None,
        labels: dict[str, str] | None = None,
        tags: list[str] | None = None,
        spot: bool = False,
        guaranteed: bool = False,
        reservation_name: str | None = None,
        valid_until_seconds: int | None = None,
        description: str | None = None,
        create_timeout_seconds: float = 3600,
        delete_timeout_seconds: float = 1800,
        poll_seconds: float = 15,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        inputs = {
            key: value
            for key, value in locals().items()
            if not key.startswith("_") and key not in {"self", "resource_name", "opts"}
        }
        inputs.update(state=None, queued_resource_name=None, node_name=None, node_state=None,
                      held=None)
        super().__init__(QueuedTpuProvider(), resource_name, inputs, opts)
