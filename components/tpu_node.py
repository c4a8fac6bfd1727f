"""One TPU VM node (single host or pod slice) that boots into the stack's job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_gcp as gcp

import node_agent as agent
from components.fallback_tpu import FallbackTpu
from components.queued_tpu import QueuedTpu
from model import catalog
from model.candidates import candidate_props
from model.pulumi_types import COMPONENT_TPU_NODE
from model.settings.schema import NodeSettings, QueueSettings
from node_agent import desired
from tpu_training.config import JobConfig

TYPE = COMPONENT_TPU_NODE

# The runtime account reaches GCS, logging and the TPU API through IAM alone;
# the VM scope must not narrow it (cloud.google.com/compute/docs/access/
# service-accounts#accesscopesiam: use cloud-platform and control with IAM).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
# OS Login: SSH access by IAM (roles/compute.osLogin or osAdminLogin, plus
# iam.serviceAccountUser on the node's account), never by keys in metadata
# (cloud.google.com/compute/docs/oslogin/set-up-oslogin). gcloud's TPU ssh honours
# the node's own key (googlecloudsdk command_lib/compute/tpus/tpu_vm/ssh_utils.py,
# TpuHasOsLoginEnabled); Cloud TPU's docs do not mention OS Login (unconfirmed).
OS_LOGIN_KEY = "enable-oslogin"
# ...but that same gcloud code writes the caller's key into the node's `ssh-keys`
# metadata anyway (AddSSHKeyIfNeeded, with or without OS Login). V2Vm.metadata is
# authoritative, so every later `up --refresh` would show a diff and remove it:
# the stack leaves that one key alone. (The queued provider merges keys others
# added, components/queued_tpu.py.)
SSH_KEYS_KEY = "ssh-keys"
# A stop request (node_agent/contract.py STOP_REQUEST_KEY) is set on a running node by
# the budget-stop function, not by the stack: an `up` must not take it back.
IGNORED_METADATA = [f'metadata["{SSH_KEYS_KEY}"]',  # Pulumi property-path syntax
                    f'metadata["{agent.STOP_REQUEST_KEY}"]']
# Contract C1 (docs/design.md): the node's one pointer to what it runs
# (`tpu-stack-release`), a prefix that never changes, so a code or job change never
# touches the node (nor a queued request's place).
RELEASES_PREFIX = "releases/"


@dataclass(frozen=True)
class NodeLocations:
    """Where one node's job reads and writes: absolute gs:// prefixes."""

    data_root: str
    checkpoint_dir: str
    export_dir: str
    tensorboard_dir: str
    status_prefix: str


@dataclass(frozen=True)
class TpuNodeArgs:
    project_id: pulumi.Input[str]
    node_id: str
    settings: NodeSettings
    job: JobConfig
    locations: NodeLocations
    package_uri: str
    package_sha256: str
    service_account_email: pulumi.Input[str]
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    network_tag: str
    labels: dict[str, str]
    # What the node itself waits for (a component's depends_on does not hold
    # back its children): the TPU API, the job's grants, the package object.
    depends_on: list[pulumi.Resource] = field(default_factory=list)
    queued_resource_id: str | None = None  # provisioning: queued; default: the node id
    # The artifacts bucket resource's `name` output (TrainingPackage.bucket_name): the
    # release object takes it, so it follows a bucket replacement (components/package.py).
    artifacts_bucket_name: pulumi.Input[str] | None = None
    # A node with fallback: the subnetwork of each candidate region other than its own.
    candidate_subnetworks: dict[str, pulumi.Input[str]] = field(default_factory=dict)

    @property
    def artifacts_bucket(self) -> str:
        """The bucket the package lives in, which the node's account reads: the
        stack's artifacts bucket, or a team stack's own."""
        return self.package_uri.removeprefix("gs://").split("/", 1)[0]


def resolved_job(args: TpuNodeArgs) -> JobConfig:
    """The node's job: every location absolute, the stop notice its save must fit, its
    slice's peak FLOPs per second (the job's MFU, tpu_training.perf) and the node's mean
    time between disruptions (`checkpointEvery: auto`)."""
    loc = args.locations
    return args.job.resolve(data_root=loc.data_root, checkpoint_dir=loc.checkpoint_dir,
                            export_dir=loc.export_dir, tensorboard_dir=loc.tensorboard_dir,
                            notice_seconds=catalog.stop_notice_seconds(spot=args.settings.spot),
                            peak_flops_per_second=catalog.peak_flops_per_second(
                                args.settings.tpu),
                            mtbf_seconds=catalog.mtbf_seconds(spot=args.settings.spot))


def release_prefix(args: TpuNodeArgs) -> str:
    """`tpu-stack-release`: where the node's releases are, for the node's whole life."""
    return f"gs://{args.artifacts_bucket}/{RELEASES_PREFIX}{args.node_id}/"


def release_content(args: TpuNodeArgs) -> bytes:
    """One release (C1), the bytes the agent parses: made by the agent's own function."""
    return desired.release_content(resolved_job(args).to_dict(), args.package_uri,
                                   args.package_sha256)


def node_metadata(args: TpuNodeArgs) -> dict[str, str]:
    """Every metadata key of the agent's contract (docs/design.md). None of them
    changes with the code or the job: those are releases under `tpu-stack-release`."""
    loc = args.locations
    return {
        agent.STARTUP_SCRIPT_KEY: agent.startup_script(),
        agent.RELEASE_KEY: release_prefix(args),
        agent.WORKERS_KEY: args.settings.workers,
        agent.STATUS_KEY: loc.status_prefix,
        agent.NODE_KEY: args.node_id,  # the node's id: instance/name is a worker VM's
        # Tells the agent a -pjrt runtime from another (the job's PJRT environment).
        agent.RUNTIME_KEY: args.settings.runtime,
        # The agent publishes status as guest attributes; Compute Engine serves
        # them only with this key set (cloud.google.com/compute/docs/metadata/
        # manage-guest-attributes). Whether TPU VMs need it is undocumented.
        GUEST_ATTRIBUTES_KEY: "TRUE",
        OS_LOGIN_KEY: "TRUE",
    } | limit_metadata(args.settings)


def limit_metadata(node: NodeSettings) -> dict[str, str]:
    """The node's run-time limits in whole seconds (node_agent/limits.py); only those set."""
    limits = {agent.MAX_RUNTIME_KEY: node.max_runtime_seconds,
              agent.IDLE_STOP_KEY: node.idle_stop_seconds}
    return {key: str(seconds) for key, seconds in limits.items() if seconds is not None}


def accelerator_args(node: NodeSettings) -> dict[str, object]:
    """`accelerator_type` XOR `accelerator_config`, as the user chose (docs/tpu-facts.md)."""
    if node.accelerator_type:
        return {"accelerator_type": node.accelerator_type}
    tpu = node.tpu
    return {"accelerator_config": gcp.tpu.V2VmAcceleratorConfigArgs(
        type=tpu.generation.api_type, topology=tpu.topology)}


def scheduling_args(node: NodeSettings) -> gcp.tpu.V2VmSchedulingConfigArgs | None:
    """The one scheduling flag of the node's provisioning mode, if any."""
    if node.provisioning == "on-demand":
        return None
    return gcp.tpu.V2VmSchedulingConfigArgs(**{node.provisioning: True})


def queued_node(name: str, args: TpuNodeArgs, opts: pulumi.ResourceOptions) -> QueuedTpu:
    """`provisioning: queued`: the same node through a queued resource, sent with
    google-cloud-tpu because `gcp.tpu.V2QueuedResource` carries no metadata, service
    account or spot flag (docs/tpu-facts.md, "The API and the resources")."""
    node = args.settings
    queue = node.queue or QueueSettings()
    by_shape = node.accelerator_type is None  # accelerator_type XOR a config (docs/tpu-facts.md)
    return QueuedTpu(
        name,
        project=args.project_id,
        zone=node.zone,
        node_id=args.node_id,
        queued_resource_id=args.queued_resource_id,
        runtime_version=node.runtime,
        accelerator_type=node.accelerator_type,
        accelerator_config_type=node.tpu.generation.api_type if by_shape else None,
        accelerator_topology=node.tpu.topology if by_shape else None,
        subnetwork=args.subnetwork,
        spot=queue.spot,
        guaranteed=queue.guaranteed,
        reservation_name=queue.reservation_name,
        valid_until_seconds=queue.valid_until_seconds,
        **_dynamic_node_props(args),
        opts=opts,
    )


def fallback_node(name: str, args: TpuNodeArgs, opts: pulumi.ResourceOptions) -> FallbackTpu:
    """A node with `fallback`: each candidate a queued resource carrying the same node (id,
    metadata, account, labels), tried in order (components/fallback_tpu.py)."""
    node = args.settings
    subnets = {catalog.region_of(node.zone): args.subnetwork, **args.candidate_subnetworks}
    return FallbackTpu(
        name,
        project=args.project_id,
        node_id=args.node_id,
        queued_resource_id=args.queued_resource_id,
        candidates=[candidate_props(c, subnets[catalog.region_of(c.zone)])
                    for c in node.candidates],
        max_wait_seconds=node.max_wait_seconds,
        **_dynamic_node_props(args),
        opts=opts,
    )


def _dynamic_node_props(args: TpuNodeArgs) -> dict[str, Any]:
    """What a queued node and a node with fallback carry alike: its network, account,
    metadata, labels and tags."""
    return {"network": args.network, "enable_external_ips": args.settings.external_ips,
            "service_account_email": args.service_account_email,
            "scopes": [CLOUD_PLATFORM_SCOPE], "metadata": node_metadata(args),
            "labels": args.labels, "tags": [args.network_tag],
            "description": description(args.settings)}


def v2_vm(name: str, args: TpuNodeArgs, opts: pulumi.ResourceOptions) -> gcp.tpu.V2Vm:
    node = args.settings
    return gcp.tpu.V2Vm(
        name,
        name=args.node_id,
        project=args.project_id,
        zone=node.zone,
        runtime_version=node.runtime,
        **accelerator_args(node),
        scheduling_config=scheduling_args(node),
        network_config=gcp.tpu.V2VmNetworkConfigArgs(
            network=args.network,
            subnetwork=args.subnetwork,
            enable_external_ips=node.external_ips,
        ),
        service_account=gcp.tpu.V2VmServiceAccountArgs(
            email=args.service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]),
        labels=args.labels,
        tags=[args.network_tag],
        metadata=node_metadata(args),
        description=description(node),
        opts=opts.merge(pulumi.ResourceOptions(ignore_changes=IGNORED_METADATA)),
    )


def description(node: NodeSettings) -> str:
    # No job name: pointing a node at another job is a new release, not a node update.
    return f"tpu-stack node {node.name}"


class TpuNode(pulumi.ComponentResource):
    """A `gcp.tpu.V2Vm` with the runtime account, no external IPs unless asked,
    the stack's labels and every metadata key the node agent reads."""

    node_id: str
    release: gcp.storage.BucketObject
    vm: gcp.tpu.V2Vm | QueuedTpu | FallbackTpu

    def __init__(self, name: str, args: TpuNodeArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.node_id = args.node_id
        # Child names carry the component's: a URN holds the parent's type but
        # not its name, so two nodes' "vm" children would collide.
        self.release = self._release(name, args)
        # docs/tpu-facts.md: with an explicit name a replacement must delete first.
        child = pulumi.ResourceOptions(parent=self, delete_before_replace=True,
                                       depends_on=[*args.depends_on, self.release])
        if args.settings.fallback:
            self.vm = fallback_node(f"{name}-fallback", args, child)
        elif args.settings.provisioning == "queued":
            self.vm = queued_node(f"{name}-queued", args, child)
        else:
            self.vm = v2_vm(f"{name}-vm", args, child)
        self.register_outputs({"nodeId": self.node_id})

    def _release(self, name: str, args: TpuNodeArgs) -> gcp.storage.BucketObject:
        """This release's object, under a logical name with its content hash: a new
        release is a new resource, created before the old one's delete (the engine
        deletes what left the program after every create and update, components/
        package.py), never a replacement, which would delete the explicitly named
        object first. It waits for the package it names (in `depends_on`)."""
        content = release_content(args)
        object_name = desired.release_name(content)  # release-<hash16>.json
        return gcp.storage.BucketObject(
            f"{name}-{object_name.removesuffix(agent.RELEASE_OBJECT_SUFFIX)}",
            bucket=args.artifacts_bucket_name or args.artifacts_bucket,
            name=f"{RELEASES_PREFIX}{args.node_id}/{object_name}",
            content=content.decode(),
            content_type="application/json",
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.depends_on),
        )
