"""Compare two offline plans (base branch vs pull request) for the PR comment.

`diff_plans(base, head)` works on `Plan.to_json()` dicts: resources added,
changed (which properties) and removed, the cost delta, and every TPU node the
change would replace, with the property that forces it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components import queued_tpu
from ops.plan.report import (
    check_format,
    duplicate_urns,
    duplicates_section,
    heading,
    money,
    node_name,
    per_month,
    plain,
    policy_section,
    provisioning_of,
    table,
    warnings_section,
)
from policy.evaluate import Violation
from policy.tpu_policies import V2VM, is_tpu_node

# Only these V2Vm fields update in place; any other change replaces the node
# (magic-modules mmv1/products/tpuv2/Vm.yaml, via docs/tpu-facts.md "The API and the
# resources"). Names as the engine sends them.
V2VM_IN_PLACE = frozenset({"description", "labels", "metadata", "tags", "dataDisks"})

REPLACEMENT_RISK = "a replaced TPU may not get its capacity back"
# What the old node's capacity risks once it is deleted, by its provisioning
# (ops.plan.report.provisioning_of; a queued node by "queued"). Spot and
# preemptible TPUs run on spare capacity only (cloud.google.com/tpu/docs/spot);
# a queued request is served in turn and "when demand is high, not all requests
# can be immediately provisioned" (cloud.google.com/tpu/docs/queued-resources).
CAPACITY_RISK = {
    "spot": "its spot capacity may not come back: spot TPUs run only on spare capacity",
    "preemptible": "its preemptible capacity may not come back: preemptible TPUs run only "
                   "on spare capacity",
    "queued": "its queued capacity may not come back: the new request joins the queue "
              "again and may wait hours or days",
    "reserved": "its reserved capacity comes back only if the freed reservation slot is "
                "still free when the new node is created",
    "on-demand": "on-demand capacity in {zone} is not guaranteed without a reservation",
}


@dataclass(frozen=True)
class Change:
    urn: str
    type: str
    name: str
    node: str  # the TPU node's logical name (ops.plan.report.node_name)
    properties: tuple[str, ...]  # dotted paths of changed inputs, `(protect)` for the option
    replaced_by: tuple[str, ...]  # the properties that force a TPU node's replacement
    capacity: str = ""  # the old node's provisioning (provisioning_of), for a TPU node
    zone: str = ""

    @property
    def replaces_tpu(self) -> bool:
        return bool(self.replaced_by)


@dataclass(frozen=True)
class PlanDiff:
    stack: str
    head: Mapping[str, Any]
    added: list[Mapping[str, Any]] = field(default_factory=list)
    removed: list[Mapping[str, Any]] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    base_usd_per_hour: float | None = None
    head_usd_per_hour: float | None = None

    @property
    def replacements(self) -> list[Change]:
        return [c for c in self.changed if c.replaces_tpu]

    @property
    def removed_tpu_nodes(self) -> list[Mapping[str, Any]]:
        return [r for r in self.removed if is_tpu_node(r["type"], r.get("inputs", {}))]

    @property
    def usd_per_hour_delta(self) -> float | None:
        if self.base_usd_per_hour is None or self.head_usd_per_hour is None:
            return None
        return self.head_usd_per_hour - self.base_usd_per_hour

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def _is_plan(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("resources"), list)


def load_plan(path: Path) -> dict[str, Any]:
    """A plan saved with `tpuctl plan --format json`; one clear error otherwise."""
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--against {path}: cannot read a plan ({error})") from None
    if not _is_plan(plan):
        raise ValueError(f"--against {path}: not a plan (save one with "
                         "`tpuctl plan --stack NAME --format json`)")
    return plan


def changed_paths(base: Any, head: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths where two input trees differ; lists compare whole.

    Engine-internal keys (`__provider`, a dynamic resource's pickled provider) are skipped."""
    if isinstance(base, Mapping) and isinstance(head, Mapping):
        for key in sorted(k for k in {*base, *head} if not k.startswith("__")):
            yield from changed_paths(base.get(key), head.get(key), f"{prefix}{key}.")
    elif base != head:
        yield prefix.rstrip(".")


def replacing_properties(resource_type: str, inputs: Mapping[str, Any],
                         paths: Sequence[str]) -> tuple[str, ...]:
    """The changed properties that replace a TPU node rather than update it."""
    if resource_type == V2VM:
        kept = V2VM_IN_PLACE
    elif is_tpu_node(resource_type, inputs):
        # What the queued node's provider updates in place (QueuedTpuProvider.diff).
        kept = frozenset(queued_tpu.IN_PLACE + queued_tpu.PROVIDER_ONLY)
    else:
        return ()
    return tuple(p for p in paths if p.split(".", 1)[0] not in kept)


def _change(base: Mapping[str, Any], head: Mapping[str, Any]) -> Change | None:
    paths = list(changed_paths(base.get("inputs", {}), head.get("inputs", {})))
    if bool(base.get("protect")) != bool(head.get("protect")):
        paths.append("(protect)")
    if not paths:
        return None
    input_paths = [p for p in paths if p != "(protect)"]
    replaced_by = replacing_properties(head["type"], head.get("inputs", {}), input_paths)
    return Change(head["urn"], head["type"], head["name"], node_name(head), tuple(paths),
                  replaced_by, provisioning_of(base) if replaced_by else "",
                  str(base.get("inputs", {}).get("zone", "")))


def diff_plans(base: Mapping[str, Any], head: Mapping[str, Any]) -> PlanDiff:
    """What merging `head` over `base` changes, resource by resource (by URN)."""
    base, head = plain(base), plain(head)
    before = {r["urn"]: r for r in base.get("resources", []) if r.get("custom", True)}
    after = {r["urn"]: r for r in head.get("resources", []) if r.get("custom", True)}
    changes = (_change(before[urn], after[urn]) for urn in after if urn in before)
    return PlanDiff(
        stack=str(head.get("stack")),
        head=head,
        added=[r for urn, r in after.items() if urn not in before],
        removed=[r for urn, r in before.items() if urn not in after],
        changed=[c for c in changes if c is not None],
        base_usd_per_hour=base.get("cost", {}).get("usdPerHour"),
        head_usd_per_hour=head.get("cost", {}).get("usdPerHour"),
    )


def capacity_risk(provisioning: str, zone: str) -> str:
    kind = provisioning.split(",", 1)[0]
    return CAPACITY_RISK.get(kind, REPLACEMENT_RISK).format(zone=zone or "the zone")


def replacement_warnings(diff: PlanDiff) -> list[str]:
    """One loud line per TPU node the change replaces or removes: a node's id is a
    fixed name, so the old node is deleted first (V2Vm delete_before_replace,
    QueuedTpuProvider.diff), and what its kind of capacity risks then."""
    lines = [f"TPU node {c.node} will be REPLACED (deleted, then created) because "
             f"{', '.join(c.replaced_by)} changed: the old {c.capacity} node is deleted "
             f"before the new one exists, and {capacity_risk(c.capacity, c.zone)}."
             for c in diff.replacements]
    lines += [f"TPU node {node_name(r)} will be DELETED; "
              f"{capacity_risk(provisioning_of(r), str(r.get('inputs', {}).get('zone', '')))}."
              for r in diff.removed_tpu_nodes]
    return lines


def cost_line(diff: PlanDiff) -> str:
    delta = diff.usd_per_hour_delta
    return (f"Cost: {money(diff.base_usd_per_hour)}/hour → {money(diff.head_usd_per_hour)}/hour "
            f"(change {money(delta, signed=True)}/hour, "
            f"{money(per_month(delta), signed=True)}/month)")


def _rows(diff: PlanDiff) -> list[list[str]]:
    rows = [["add", r["name"], r["type"], ""] for r in diff.added]
    rows += [["replace" if c.replaces_tpu else "update", c.name, c.type, ", ".join(c.properties)]
             for c in diff.changed]
    rows += [["delete", r["name"], r["type"], ""] for r in diff.removed]
    return rows


def _text(diff: PlanDiff, violations: Sequence[Violation], *, markdown: bool) -> str:
    parts = [heading(f"tpu-stack plan diff: {diff.stack}", markdown=markdown),
             *duplicates_section(diff.head, markdown=markdown),
             *warnings_section(diff.head, markdown=markdown)]
    warnings = replacement_warnings(diff)
    if warnings and markdown:
        parts.append("> [!WARNING]\n" + "\n".join(f"> **{w}**  " for w in warnings))
    elif warnings:
        parts.append("\n".join(f"WARNING: {w}" for w in warnings))
    parts.append(cost_line(diff))
    if diff.empty:
        parts.append("No resource changes.")
    else:
        parts.append(f"{len(diff.added)} to add, {len(diff.changed)} to change, "
                     f"{len(diff.removed)} to delete")
        parts.append(table(("action", "resource", "type", "properties"), _rows(diff),
                           markdown=markdown))
    parts.append(policy_section(violations, markdown=markdown))
    return "\n\n".join(parts) + "\n"


def diff_to_json(diff: PlanDiff, violations: Sequence[Violation] = ()) -> dict[str, Any]:
    return {
        "stack": diff.stack,
        "added": [r["urn"] for r in diff.added],
        "removed": [r["urn"] for r in diff.removed],
        "changed": [{"urn": c.urn, "properties": list(c.properties),
                     "replacesTpuNode": c.replaces_tpu, "replacedBy": list(c.replaced_by)}
                    for c in diff.changed],
        "warnings": replacement_warnings(diff),
        "duplicateUrns": duplicate_urns(diff.head),
        "cost": {"baseUsdPerHour": diff.base_usd_per_hour,
                 "headUsdPerHour": diff.head_usd_per_hour,
                 "deltaUsdPerHour": diff.usd_per_hour_delta,
                 "deltaUsdPerMonth": per_month(diff.usd_per_hour_delta)},
        "violations": [v.to_json() for v in violations],
    }


def render_diff(diff: PlanDiff, fmt: str, violations: Sequence[Violation] = ()) -> str:
    """The diff as `fmt` (markdown, table or json), with the head plan's policy results."""
    if check_format(fmt) == "json":
        return json.dumps(diff_to_json(diff, violations), indent=2, sort_keys=True) + "\n"
    return _text(diff, violations, markdown=fmt == "markdown")
