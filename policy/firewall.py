"""Which connections a plan's VPC firewall rules admit: "may node A open protocol P,
port N on node B?", evaluated as GCP evaluates VPC firewall rules.

Pure: it reads `gcp:compute/firewall:Firewall` inputs as the offline plan records
them (camelCase) and knows nothing of Pulumi. The rules it follows
(cloud.google.com/firewall/docs/firewalls):
- every rule is INGRESS or EGRESS; a disabled rule does nothing;
- a rule applies to the instances of its network that its targets name
  (targetTags or targetServiceAccounts; neither: every instance);
- an ingress rule's source matches when the sender's address is in sourceRanges
  OR the sender carries one of sourceTags / runs as one of sourceServiceAccounts
  (those two only for senders in the same network); an ingress rule with
  destinationRanges applies only to traffic addressed to them (provider 4.49,
  GoogleCloudPlatform/magic-modules#6931);
- a rule matches a protocol and, for tcp/udp/sctp, a port if `allows`/`denies`
  list it (no ports: every port; protocol "all": everything);
- the matching rule with the lowest priority number decides; at equal priority a
  deny beats an allow; no rule matches: the implied rules decide (deny ingress,
  allow egress, priority 65535).
A connection is admitted when the sender's egress and the receiver's ingress both
allow it. What an endpoint can lie about: its network tags (whoever may update a node
sets any tag on it, cloud.google.com/firewall/docs/tags-firewalls-overview:
`Endpoint.forging`); not its address, which comes from a subnet IAM lets it use
(compute.subnetworks.use), nor its account (actAs). Addresses: an endpoint is given as
the range it lives in (its subnet); for an allow rule a range that overlaps counts as a
match, for a deny only one that contains it, so the check errs towards admitting (an
isolation test stays sound).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from model.pulumi_types import COMPUTE_FIREWALL

DEFAULT_PRIORITY = 1000  # pulumi-gcp Firewall.priority: "Defaults to 1000"
PORTED = frozenset({"tcp", "udp", "sctp"})


@dataclass(frozen=True)
class Endpoint:
    """A VM (a TPU node's worker) or an outside sender such as IAP's range."""

    name: str
    network: str | None  # None: outside every VPC network
    cidr: str
    account: str | None = None
    tags: frozenset[str] = frozenset()

    def forging(self, tags: frozenset[str]) -> Endpoint:
        """The same endpoint carrying `tags` too: a tag is whatever its owner sets."""
        return Endpoint(self.name, self.network, self.cidr, self.account, self.tags | tags)


@dataclass(frozen=True)
class Rule:
    name: str
    network: str
    direction: str
    priority: int
    deny: bool
    protocols: tuple[tuple[str, tuple[str, ...]], ...]  # (protocol, ports; () = all)
    ranges: tuple[str, ...] = ()  # source (ingress) or destination (egress) ranges
    ingress_destinations: tuple[str, ...] = ()  # an ingress rule's destinationRanges
    source_tags: frozenset[str] = frozenset()
    source_accounts: frozenset[str] = frozenset()
    target_tags: frozenset[str] = frozenset()
    target_accounts: frozenset[str] = frozenset()
    disabled: bool = False

    @classmethod
    def of(cls, name: str, inputs: Mapping[str, Any]) -> Rule:
        deny = bool(inputs.get("denies"))
        entries = inputs.get("denies") if deny else inputs.get("allows")
        protocols = tuple((str(e["protocol"]).lower(), tuple(str(p) for p in e.get("ports") or ()))
                          for e in entries or ())
        direction = str(inputs.get("direction") or "INGRESS")
        ranges = inputs.get("sourceRanges" if direction == "INGRESS" else "destinationRanges")
        return cls(
            name=name, network=str(inputs["network"]), direction=direction,
            priority=int(inputs.get("priority", DEFAULT_PRIORITY)), deny=deny,
            protocols=protocols, ranges=tuple(ranges or ()),
            ingress_destinations=tuple(inputs.get("destinationRanges") or ())
            if direction == "INGRESS" else (),
            source_tags=frozenset(inputs.get("sourceTags") or ()),
            source_accounts=frozenset(inputs.get("sourceServiceAccounts") or ()),
            target_tags=frozenset(inputs.get("targetTags") or ()),
            target_accounts=frozenset(inputs.get("targetServiceAccounts") or ()),
            disabled=bool(inputs.get("disabled")))

    def targets(self, endpoint: Endpoint) -> bool:
        if endpoint.network != self.network:
            return False
        if self.target_accounts:
            return endpoint.account in self.target_accounts
        if self.target_tags:
            return bool(self.target_tags & endpoint.tags)
        return True

    def carries(self, protocol: str, port: int) -> bool:
        for allowed, ports in self.protocols:
            if allowed not in (protocol, "all"):
                continue
            if not ports or protocol not in PORTED or any(_in_port_range(port, p) for p in ports):
                return True
        return False

    def source_matches(self, sender: Endpoint) -> bool:
        if any(_range_matches(r, sender.cidr, loose=not self.deny) for r in self.ranges):
            return True
        if sender.network != self.network:
            return False
        return (sender.account in self.source_accounts
                or bool(self.source_tags & sender.tags))

    def destination_matches(self, receiver: Endpoint) -> bool:
        ranges = self.ingress_destinations if self.direction == "INGRESS" else self.ranges
        return not ranges or any(_range_matches(r, receiver.cidr, loose=not self.deny)
                                 for r in ranges)


def rules_of(resources: Iterable[Any]) -> list[Rule]:
    """Every firewall rule of plan resources (Registrations, or dicts with type and inputs)."""
    rules = []
    for resource in resources:
        kind, inputs = ((resource["type"], resource.get("inputs") or {})
                        if isinstance(resource, Mapping) else (resource.type, resource.inputs))
        if kind == COMPUTE_FIREWALL:
            rules.append(Rule.of(str(inputs.get("name")), inputs))
    return rules


def _decide(matching: list[Rule], implied_allow: bool) -> bool:
    if not matching:
        return implied_allow
    first = min(rule.priority for rule in matching)
    return not any(rule.deny for rule in matching if rule.priority == first)


def ingress_allows(rules: Iterable[Rule], sender: Endpoint, receiver: Endpoint,
                   protocol: str, port: int) -> bool:
    matching = [r for r in rules if r.direction == "INGRESS" and not r.disabled
                and r.targets(receiver) and r.carries(protocol, port) and r.source_matches(sender)
                and r.destination_matches(receiver)]
    return _decide(matching, implied_allow=False)


def egress_allows(rules: Iterable[Rule], sender: Endpoint, receiver: Endpoint,
                  protocol: str, port: int) -> bool:
    if sender.network is None:
        return True  # outside the VPC: no egress rule of this network applies
    matching = [r for r in rules if r.direction == "EGRESS" and not r.disabled
                and r.targets(sender) and r.carries(protocol, port)
                and r.destination_matches(receiver)]
    return _decide(matching, implied_allow=True)


def admits(rules: list[Rule], sender: Endpoint, receiver: Endpoint, protocol: str,
           port: int) -> bool:
    """Whether GCP lets `sender` open protocol/port on `receiver`."""
    return (egress_allows(rules, sender, receiver, protocol, port)
            and ingress_allows(rules, sender, receiver, protocol, port))


def _in_port_range(port: int, spec: str) -> bool:
    low, _, high = spec.partition("-")
    return int(low) <= port <= int(high or low)


def _range_matches(rule_range: str, cidr: str, *, loose: bool) -> bool:
    rule_net = ipaddress.ip_network(rule_range, strict=False)
    net = ipaddress.ip_network(cidr, strict=False)
    if rule_net.version != net.version:
        return False
    return rule_net.overlaps(net) if loose else net.subnet_of(rule_net)  # type: ignore[arg-type]
