"""The firewall evaluator (policy/firewall.py) follows GCP's VPC firewall rules:
priorities, deny over allow at equal priority, implied rules, targets by tag or
service account, sources by range, tag or account."""

from __future__ import annotations

from policy.firewall import Endpoint, Rule, admits

NET = "projects/host/global/networks/tpu"
A = Endpoint("a", NET, "10.128.0.0/21", account="a@p.iam", tags=frozenset({"node"}))
B = Endpoint("b", NET, "10.128.8.0/21", account="b@p.iam", tags=frozenset({"node"}))
IAP = Endpoint("iap", None, "35.235.240.0/20")


def rule(name: str, **inputs) -> Rule:
    return Rule.of(name, {"network": NET, "direction": "INGRESS",
                          "allows": [{"protocol": "tcp"}], **inputs})


def test_no_rule_denies_ingress_and_allows_egress() -> None:
    assert not admits([], A, B, "tcp", 8470)
    egress_only = [rule("e", direction="EGRESS", destinationRanges=["0.0.0.0/0"])]
    assert not admits(egress_only, A, B, "tcp", 8470)


def test_a_tag_rule_admits_every_node_carrying_the_tag() -> None:
    by_tag = [rule("internal", sourceRanges=["10.128.0.0/20"], targetTags=["node"])]
    assert admits(by_tag, A, B, "tcp", 8470) and admits(by_tag, B, A, "udp", 53) is False
    assert admits(by_tag, B, A, "tcp", 1)


def test_an_account_rule_admits_only_that_account() -> None:
    peers = [rule("a-peers", sourceServiceAccounts=["a@p.iam"], targetServiceAccounts=["a@p.iam"])]
    a2 = Endpoint("a2", NET, "10.128.8.0/21", account="a@p.iam")
    assert admits(peers, A, a2, "tcp", 8470)
    assert not admits(peers, B, A, "tcp", 8470) and not admits(peers, A, B, "tcp", 8470)
    outside = Endpoint("x", "projects/o/global/networks/n", "10.128.0.0/21", account="a@p.iam")
    assert not admits(peers, outside, A, "tcp", 8470)  # account sources: same network only


def test_lowest_priority_number_wins_and_deny_wins_a_tie() -> None:
    allow = rule("allow", sourceRanges=["10.128.0.0/16"], priority=1000)
    deny = rule("deny", sourceRanges=["10.128.0.0/16"], priority=900,
                allows=None, denies=[{"protocol": "all"}])
    assert not admits([allow, deny], A, B, "tcp", 22)
    deny_later = Rule.of("deny", {**_inputs(deny), "priority": 2000})
    assert admits([allow, deny_later], A, B, "tcp", 22)
    tie = Rule.of("deny", {**_inputs(deny), "priority": 1000})
    assert not admits([allow, tie], A, B, "tcp", 22)
    assert admits([allow, Rule.of("off", {**_inputs(deny), "disabled": True})], A, B, "tcp", 22)


def test_ports_and_protocols() -> None:
    ssh = [rule("ssh", sourceRanges=["35.235.240.0/20"], allows=[{"protocol": "tcp",
                                                                   "ports": ["22", "8000-8100"]}])]
    assert admits(ssh, IAP, A, "tcp", 22) and admits(ssh, IAP, A, "tcp", 8050)
    assert not admits(ssh, IAP, A, "tcp", 8470) and not admits(ssh, IAP, A, "udp", 22)


def test_an_egress_deny_stops_what_ingress_allows() -> None:
    allow = rule("allow", sourceRanges=["10.128.0.0/16"])
    block = rule("no-egress", direction="EGRESS", destinationRanges=["10.128.8.0/21"],
                 allows=None, denies=[{"protocol": "tcp"}])
    assert not admits([allow, block], A, B, "tcp", 8470)
    assert admits([allow, block], B, A, "tcp", 8470)


def _inputs(r: Rule) -> dict:
    entries = [{"protocol": p, "ports": list(ports)} for p, ports in r.protocols]
    return {"network": r.network, "direction": r.direction, "priority": r.priority,
            "sourceRanges": list(r.ranges), ("denies" if r.deny else "allows"): entries}
