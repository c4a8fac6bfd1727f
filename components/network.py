"""The VPC the TPU nodes live in: no external IPs, GCS through Private Google Access."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.naming import Naming
from components.subnets import subnet_ranges

TYPE = "tpu-stack:index:Network"

# cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule: the range
# IAP TCP forwarding connects from.
IAP_SOURCE_RANGE = "35.235.240.0/20"


@dataclass(frozen=True)
class NetworkArgs:
    project_id: pulumi.Input[str]
    naming: Naming
    regions: list[str]
    subnet_cidr: str
    ssh_through_iap: bool
    node_tag: str
    pinned: dict[str, str] = field(default_factory=dict)  # region → range kept as it is


class Network(pulumi.ComponentResource):
    """A custom-mode VPC, a subnet per region with Private Google Access, and
    firewall rules: traffic between the stack's nodes (pod workers talk to each
    other) and SSH only through IAP."""

    network: gcp.compute.Network
    subnets: dict[str, gcp.compute.Subnetwork]

    def __init__(self, name: str, args: NetworkArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        naming = args.naming
        self.network = gcp.compute.Network(
            "vpc",
            name=naming.network_resource("tpu"),
            project=args.project_id,
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            opts=child,
        )
        ranges = subnet_ranges(args.subnet_cidr, args.regions, args.pinned)
        self.subnets = {
            region: gcp.compute.Subnetwork(
                f"subnet-{region}",
                name=naming.network_resource(f"tpu-{region}"),
                project=args.project_id,
                region=region,
                network=self.network.id,
                ip_cidr_range=cidr,
                # Nodes have no external IP: Private Google Access is how they
                # reach GCS and the other Google APIs.
                private_ip_google_access=True,
                opts=child,
            )
            for region, cidr in ranges.items()
        }
        allow = gcp.compute.FirewallAllowArgs
        self._ingress("allow-internal", args, sorted(ranges.values()),
                      [allow(protocol="tcp"), allow(protocol="udp"), allow(protocol="icmp")])
        if args.ssh_through_iap:
            self._ingress("allow-iap-ssh", args, [IAP_SOURCE_RANGE],
                          [allow(protocol="tcp", ports=["22"])])
        self.register_outputs({
            "network": self.network.id,
            "subnets": {region: s.id for region, s in self.subnets.items()},
        })

    def _ingress(self, rule: str, args: NetworkArgs, sources: list[str],
                 allows: list[gcp.compute.FirewallAllowArgs]) -> gcp.compute.Firewall:
        """An ingress rule to the stack's nodes (by their network tag)."""
        return gcp.compute.Firewall(
            rule,
            name=args.naming.network_resource(rule.replace("allow-", "tpu-")),
            project=args.project_id,
            network=self.network.id,
            direction="INGRESS",
            source_ranges=sources,
            target_tags=[args.node_tag],
            allows=allows,
            opts=pulumi.ResourceOptions(parent=self),
        )
