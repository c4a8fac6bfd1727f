"""TpuPlatform: the whole stack, from project to TPU nodes, from one StackSettings."""

from __future__ import annotations

import pulumi

from components import cost
from components.identity import IdentityArgs, RuntimeIdentity
from components.network import Network, NetworkArgs
from components.package import PackageArgs, TrainingPackage
from components.project import Project, ProjectArgs
from components.settings import NodeSettings, StackSettings
from components.storage import BucketsArgs, TrainingBuckets
from components.tpu_node import NodeLocations, TpuNode, TpuNodeArgs

TYPE = "tpu-stack:index:TpuPlatform"


class TpuPlatform(pulumi.ComponentResource):
    """Declares everything a team needs to train on Cloud TPU."""

    def __init__(self, name: str, settings: StackSettings,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.settings = settings
        naming = settings.naming
        self.project = Project("project", ProjectArgs(
            project_id=settings.gcp_project, settings=settings.project,
            labels=self._labels("project")), opts=self._child())
        after_apis = self._child(depends_on=self.project.services)
        project_id = self.project.project_id
        self.node_tag = naming.network_resource("tpu-node")
        self.network = Network("network", NetworkArgs(
            project_id=project_id, naming=naming, regions=settings.regions,
            subnet_cidr=settings.network.subnet_cidr,
            ssh_through_iap=settings.network.ssh_through_iap,
            node_tag=self.node_tag), opts=after_apis)
        self.buckets = TrainingBuckets("storage", BucketsArgs(
            project_id=project_id, naming=naming, settings=settings.storage,
            labels=self._labels("storage")), opts=after_apis)
        self.identity = RuntimeIdentity("identity", IdentityArgs(
            project_id=project_id, naming=naming,
            buckets={p: b.name for p, b in self.buckets.buckets.items()}), opts=after_apis)
        self.package = TrainingPackage("package", PackageArgs(
            bucket=self.buckets.names["artifacts"]),
            opts=self._child(depends_on=[self.buckets.buckets["artifacts"]]))
        node_deps = [*self.project.services, self.identity, self.package]
        self.nodes = [
            TpuNode(f"node-{node.name}", self._node_args(node, project_id),
                    opts=self._child(depends_on=node_deps))
            for node in settings.nodes
        ]
        self.cost = cost.stack_cost(settings.nodes)
        self.register_outputs({})

    def _child(self, **kwargs: object) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kwargs)  # type: ignore[arg-type]

    def _labels(self, component: str) -> dict[str, str]:
        return self.settings.naming.labels(component, self.settings.team, self.settings.labels)

    def _node_args(self, node: NodeSettings, project_id: pulumi.Input[str]) -> TpuNodeArgs:
        settings = self.settings
        node_id = settings.naming.tpu_node(node.name)
        uri = self.buckets.uri
        return TpuNodeArgs(
            project_id=project_id,
            node_id=node_id,
            settings=node,
            job=settings.job(node.job),
            locations=NodeLocations(
                data_root=uri("data"),
                checkpoint_dir=f"{uri('checkpoints')}/ckpt/{node_id}/",
                export_dir=f"{uri('checkpoints')}/export/{node_id}/",
                tensorboard_dir=f"{uri('logs')}/tb/{node_id}/",
                status_prefix=f"{uri('logs')}/status/{node_id}/",
            ),
            package_uri=self.package.uri,
            package_sha256=self.package.sha256,
            service_account_email=self.identity.email,
            network=self.network.network.id,
            subnetwork=self.network.subnets[node.zone.rsplit("-", 1)[0]].id,
            network_tag=self.node_tag,
            labels={**self._labels("tpu-node"), **node.labels, "node": node.name},
        )

    def outputs(self) -> dict[str, object]:
        """The stack outputs (issue: buckets, runtime account, package, nodes, cost)."""
        by_name = {c.name: c for c in self.cost.nodes}
        return {
            "buckets": {p: self.buckets.uri(p) for p in self.buckets.names},
            "runtimeServiceAccount": self.identity.email,
            "package": {"uri": self.package.uri, "sha256": self.package.sha256},
            "nodes": {
                node.name: {
                    "nodeId": tpu_node.node_id,
                    "zone": node.zone,
                    "acceleratorType": node.tpu.accelerator_type,
                    "topology": node.tpu.topology,
                    "chips": node.tpu.chips,
                    "hosts": node.tpu.hosts,
                    "runtimeVersion": node.runtime,
                    "provisioning": node.provisioning,
                    "usdPerHour": by_name[node.name].usd_per_hour,
                }
                for node, tpu_node in zip(self.settings.nodes, self.nodes, strict=True)
            },
            "estimatedUsdPerHour": self.cost.usd_per_hour,
            "estimatedUsdPerMonth": self.cost.usd_per_month,
        }
