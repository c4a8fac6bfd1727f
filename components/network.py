"""The VPC the TPU nodes live in: no external IPs, GCS through Private Google Access."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from model.naming import Naming
from model.pulumi_types import COMPONENT_NETWORK
from model.subnets import subnet_ranges

TYPE = COMPONENT_NETWORK

# cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule: the range
# IAP TCP forwarding connects from.
IAP_SOURCE_RANGE = "35.235.240.0/20"
# Nodes talk to each other (a pod slice's TF workers and coordinator) only within one
# set of subnets: ingress whose source AND destination are the stack's own ranges (a
# team's: its own subnets, components/teams.py). Addresses, not network tags nor service
# accounts: "network tags ... don't offer any kind of access control. You can choose to
# assign any value ... to the tag field on any VM you own" (cloud.google.com/firewall/
# docs/tags-firewalls-overview; a TPU node's `tags` are set by whoever holds
# tpu.nodes.create/update in its project), and that GCP matches a TPU VM by its service
# account (in a Shared VPC service project) is unconfirmed, while a node's address comes
# from a subnet its creator (and its project's TPU service agent) holds
# compute.subnetworks.use on, which IAM grants per subnet. Ingress rules take destination
# ranges since provider 4.49 (GoogleCloudPlatform/magic-modules#6931; cloud-foundation-
# fabric issue 1303): with no target, the rule applies to every instance, for traffic to
# these ranges only. Every port: TF's gRPC server on 8470 and the coordination service's
# port are whatever the job picks (docs/tpu-facts.md, "Pod slices: the ports workers use").
# Everything else is refused by the implied deny-ingress rule (priority 65535);
# no allow rule has a wider source, so a lower-numbered deny is not needed.
PEER_PRIORITY = 1000
PEER_PROTOCOLS = ("tcp", "udp", "icmp")


@dataclass(frozen=True)
class NetworkArgs:
    project_id: pulumi.Input[str]
    naming: Naming
    regions: list[str]
    subnet_cidr: str
    ssh_through_iap: bool
    node_tag: str  # what the IAP SSH rule targets
    pinned: dict[str, str] = field(default_factory=dict)  # region → range kept as it is


class Network(pulumi.ComponentResource):
    """A custom-mode VPC, a subnet per region with Private Google Access, and
    firewall rules: traffic within the stack's own subnets (pod workers talk to each
    other; each team's subnets get their own rule, teams.py) and SSH only through IAP."""

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
        peer_firewall("allow-internal", naming.network_resource("tpu-internal"),
                      args.project_id, self.network.id, sorted(ranges.values()),
                      pulumi.ResourceOptions(parent=self))
        if args.ssh_through_iap:
            self._ingress("allow-iap-ssh", args, [IAP_SOURCE_RANGE],
                          [gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])])
        self.register_outputs({
            "network": self.network.id,
            "subnets": {region: s.id for region, s in self.subnets.items()},
        })

    def _ingress(self, rule: str, args: NetworkArgs, sources: list[str],
                 allows: list[gcp.compute.FirewallAllowArgs]) -> gcp.compute.Firewall:
        """An ingress rule from `sources` to the stack's nodes (by their network tag:
        a forged tag only opens IAP's SSH path, which IAP's own IAM still guards)."""
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


def peer_firewall(logical: str, name: str, project_id: pulumi.Input[str],
                  network_id: pulumi.Input[str], ranges: list[str],
                  opts: pulumi.ResourceOptions) -> gcp.compute.Firewall:
    """Ingress from `ranges` to `ranges` on every protocol and port, and nothing else."""
    return gcp.compute.Firewall(
        logical, name=name, project=project_id, network=network_id, direction="INGRESS",
        priority=PEER_PRIORITY, source_ranges=ranges, destination_ranges=ranges,
        allows=[gcp.compute.FirewallAllowArgs(protocol=p) for p in PEER_PROTOCOLS], opts=opts)
