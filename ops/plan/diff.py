"""Compare two offline plans (base branch vs pull request) for the PR comment.

`diff_plans(base, head)` works on `Plan.to_json()` dicts: the engine's steps
(ops/plan/steps.py: create, update, replace with or without delete-first, delete),
each replacement's chain of causes, and the cost delta. The text reads like
`pulumi preview --diff`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.plan.report import (
    check_format,
    duplicate_urns,
    duplicates_section,
    gcp_name,
    heading,
    money,
    node_name,
    per_month,
    plain,
    policy_section,
    provisioning_of,
    warnings_section,
)
from ops.plan.steps import UNKNOWN, Change, Step, Steps, plan_steps
from policy.evaluate import Violation
from policy.tpu_policies import is_tpu_node

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
OPS = ("create", "update", "replace", "delete")
SUMMARY_WORDS = {"create": "+ {} to create", "update": "~ {} to update",
                 "replace": "+- {} to replace", "delete": "- {} to delete"}


@dataclass(frozen=True)
class PlanDiff:
    stack: str
    head: Mapping[str, Any]
    steps: Steps
    base_usd_per_hour: float | None = None
    head_usd_per_hour: float | None = None

    @property
    def added(self) -> list[Mapping[str, Any]]:
        return [s.resource for s in self.steps.of("create")]

    @property
    def removed(self) -> list[Mapping[str, Any]]:
        return [s.resource for s in self.steps.of("delete")]

    @property
    def changed(self) -> list[Step]:
        return [s for s in self.steps.steps if s.op in ("update", "replace")]

    @property
    def replacements(self) -> list[Step]:
        return self.steps.of("replace")

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
        return not self.steps.steps


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


def diff_plans(base: Mapping[str, Any], head: Mapping[str, Any]) -> PlanDiff:
    """What merging `head` over `base` makes the engine do, resource by resource (by URN)."""
    base, head = plain(base), plain(head)
    return PlanDiff(
        stack=str(head.get("stack")),
        head=head,
        steps=plan_steps(base, head),
        base_usd_per_hour=base.get("cost", {}).get("usdPerHour"),
        head_usd_per_hour=head.get("cost", {}).get("usdPerHour"),
    )


def capacity_risk(provisioning: str, zone: str) -> str:
    kind = provisioning.split(",", 1)[0]
    return CAPACITY_RISK.get(kind, REPLACEMENT_RISK).format(zone=zone or "the zone")


def shown(value: Any, *, secret: bool = False) -> str:
    """A value as the preview prints it: secrets masked, long text shortened."""
    if secret:
        return "[secret]"
    if value == UNKNOWN:
        return UNKNOWN
    text = json.dumps(value, sort_keys=True)
    if len(text) <= 60 and "\\n" not in text:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[:40]}…\" ({len(text)} chars, sha256 {digest})"


def _is_secret(step: Step, change: Change) -> bool:
    return change.path.split(".", 1)[0] in step.resource.get("secrets", ())


def label(step: Step) -> str:
    """`node trainer` for a TPU node, else the logical name."""
    if is_tpu_node(step.type, step.resource.get("inputs", {})):
        return f"node {node_name(step.resource)}"
    return step.name


def _verdict(step: Step, change: Change) -> str:
    if not change.replaces:
        return "update in place" if change.reason == "update" else change.reason
    words = [f"{change.reason}: replace" + (", delete first" if step.delete_first else "")]
    base = step.base or step.resource
    if is_tpu_node(step.type, base.get("inputs", {})):
        words.append(capacity_risk(provisioning_of(base),
                                   str(base.get("inputs", {}).get("zone", ""))))
    return "; ".join(words)


def describe(step: Step, change: Change) -> str:
    """`ipCidrRange "10.128.0.0/20" → "10.128.0.0/21" (shrinks: replace, delete first)`."""
    secret = _is_secret(step, change)
    if change.new == UNKNOWN:
        what = f"{change.path} unknown"
    else:
        what = f"{change.path} {shown(change.old, secret=secret)} → " \
               f"{shown(change.new, secret=secret)}"
    return f"{what} ({_verdict(step, change)})"


def chain(diff: PlanDiff, step: Step) -> str:
    """The replacement's causes, from the first replaced resource to this one."""
    by_urn = diff.steps.by_urn()
    cause = step.replaced_by[0]
    upstream = by_urn.get(cause.unknown_from or "")
    own = f"{label(step)}: {describe(step, cause)}"
    return f"{chain(diff, upstream)} → {own}" if upstream is not None else own


def replacement_warnings(diff: PlanDiff) -> list[str]:
    """One loud line per replacement that ends a chain (nothing replaced takes its
    outputs), with the chain; one per update a waiting queued node holds; and one per
    TPU node deleted, with what its capacity risks."""
    sources = {c.unknown_from for s in diff.replacements for c in s.replaced_by}
    lines = [f"{_replaced(s)}: {chain(diff, s)}"
             for s in diff.replacements if s.urn not in sources]
    lines += [f"TPU node {node_name(s.resource)} is queued: if its request is still waiting, "
              f"this update ({', '.join(s.paths)}) is held and applied once the node exists; "
              "the request keeps its place in the queue (components/queued_tpu.py "
              "QueuedTpuProvider.update)."
              for s in diff.steps.steps if s.held_while_waiting]
    lines += [f"TPU node {node_name(r)} will be DELETED; "
              f"{capacity_risk(provisioning_of(r), str(r.get('inputs', {}).get('zone', '')))}."
              for r in diff.removed_tpu_nodes]
    return lines


def _replaced(step: Step) -> str:
    if is_tpu_node(step.type, step.resource.get("inputs", {})):
        return f"TPU node {node_name(step.resource)} will be REPLACED"
    return f"{step.name} will be REPLACED"


def cost_line(diff: PlanDiff) -> str:
    delta = diff.usd_per_hour_delta
    return (f"TPU cost: {money(diff.base_usd_per_hour)}/hour → {money(diff.head_usd_per_hour)}"
            f"/hour (change {money(delta, signed=True)}/hour, "
            f"{money(per_month(delta), signed=True)}/month; TPU nodes only, list prices)")


def summary(diff: PlanDiff) -> str:
    counts = diff.steps.counts()
    parts = [SUMMARY_WORDS[op].format(counts[op]) for op in OPS if counts[op]]
    return f"Resources: {', '.join(parts)}" if parts else "No resource changes."


def step_lines(step: Step) -> list[str]:
    """One step as `pulumi preview --diff` prints it."""
    name = gcp_name(step.resource)
    how = {"replace": "replace, delete first" if step.delete_first else "replace"}.get(
        step.op, step.op)
    lines = [f"{step.marker:<2} {step.type}  {step.name}" + (f"  [{name}]" if name else "")
             + f"  ({how})"]
    if step.delete_first:
        lines.append(f"       delete first: {step.delete_first_because}")
    lines += [f"     {'+-' if c.replaces else '~'} {describe(step, c)}" for c in step.changes]
    return lines


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
    if not diff.empty:
        body = "\n".join(line for s in diff.steps.steps for line in step_lines(s))
        parts.append(f"```diff\n{body}\n```" if markdown else body)
    parts.append(summary(diff))
    parts.append(policy_section(violations, markdown=markdown))
    return "\n\n".join(parts) + "\n"


def step_json(diff: PlanDiff, step: Step) -> dict[str, Any]:
    return {
        "op": step.op, "urn": step.urn, "type": step.type, "name": step.name,
        "gcpName": gcp_name(step.resource), "deleteFirst": step.delete_first,
        "deleteFirstBecause": step.delete_first_because,
        "changes": [{"path": c.path,
                     "old": "[secret]" if _is_secret(step, c) else c.old,
                     "new": "[secret]" if _is_secret(step, c) else c.new,
                     "replaces": c.replaces, "reason": c.reason, "unknownFrom": c.unknown_from}
                    for c in step.changes],
        **({"chain": chain(diff, step)} if step.op == "replace" else {}),
    }


def diff_to_json(diff: PlanDiff, violations: Sequence[Violation] = ()) -> dict[str, Any]:
    return {
        "stack": diff.stack,
        "steps": [step_json(diff, s) for s in diff.steps.steps],
        "summary": diff.steps.counts(),
        "warnings": replacement_warnings(diff),
        "duplicateUrns": duplicate_urns(diff.head),
        "cost": {"covers": "TPU nodes only, at list prices",
                 "baseUsdPerHour": diff.base_usd_per_hour,
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
