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

from model.pulumi_types import CLOUDQUOTA_S_QUOTA_PREFERENCE, STORAGE_BUCKET
from ops.plan.chart import cost_chart
from ops.plan.report import (
    STACK_RESOURCE,
    check_format,
    default_providers,
    display_type,
    duplicate_urns,
    duplicates_section,
    gcp_name,
    heading,
    money,
    node_name,
    node_rows,
    per_month,
    policy_section,
    provisioning_of,
    shown_total,
    warnings_section,
)
from ops.plan.steps import OPS, UNKNOWN, Change, Step, Steps, plan_steps
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
# The engine's summary (pulumi/pulumi pkg/backend/display/diff.go renderSummaryEvent,
# rule `displaySummary`): one line per operation with its prefix (step.go RawPrefix), then
# "N changes" when more than one kind changes, and "M unchanged".
SUMMARY_WORDS = {"create": "+ {} to create", "update": "~ {} to update",
                 "replace": "+-{} to replace", "delete": "- {} to delete"}


@dataclass(frozen=True)
class PlanDiff:
    stack: str
    head: Mapping[str, Any]
    steps: Steps
    base_usd_per_hour: float | None = None
    head_usd_per_hour: float | None = None
    base_unconfirmed: bool = False
    head_unconfirmed: bool = False

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
        return round(self.head_usd_per_hour - self.base_usd_per_hour, 2)

    @property
    def empty(self) -> bool:
        return not self.steps.steps

    @property
    def refused(self) -> list[Step]:
        return self.steps.refused


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
    """What merging `head` over `base` makes the engine do, resource by resource (by URN).

    Both are plans as JSON data: `plain(plan.to_json())` or a saved plan read back (a
    JSON round trip here cost 80% of the diff's time at 500 nodes)."""
    return PlanDiff(
        stack=str(head.get("stack")),
        head=head,
        steps=plan_steps(base, head),
        base_usd_per_hour=shown_total(base),
        head_usd_per_hour=shown_total(head),
        base_unconfirmed=bool(base.get("cost", {}).get("unconfirmed")),
        head_unconfirmed=bool(head.get("cost", {}).get("unconfirmed")),
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
    if len(text) <= 80 and "\\n" not in text:
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
    """`ipCidrRange: "10.128.0.0/20" => "10.128.0.0/21" (shrinks: replace, delete first)`,
    `old => new` as the engine's display prints it (object_diff.go, `displayOldToNew`)."""
    secret = _is_secret(step, change)
    if change.new == UNKNOWN:
        what = f"{change.path}: {shown(change.old, secret=secret)} => {UNKNOWN}"
    else:
        what = f"{change.path}: {shown(change.old, secret=secret)} => " \
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
    lines += [f"{s.name} was protected and this change unprotects and replaces it at once: "
              "the engine allows that (it refuses only a resource protected before and "
              "after, step_generator.go continueStepsFromDiff), and what it holds is lost. "
              "Unprotect it in its own reviewed change first."
              for s in diff.replacements if s.base and s.base.get("protect")
              and not s.resource.get("protect")]
    lines += [stays_warning(s) for s in diff.steps.of("delete") if s.stays_in_gcp]
    lines += [bucket_warning(s) for s in diff.steps.steps if _empties_a_bucket(s)]
    return lines




def stays_warning(step: Step) -> str:
    """A delete that leaves the resource in GCP; for a quota preference, how to lift
    the cap it keeps."""
    if step.type == CLOUDQUOTA_S_QUOTA_PREFERENCE:
        inputs = step.resource.get("inputs", {})
        value = (inputs.get("quotaConfig") or {}).get("preferredValue")
        return (f"{step.name} is removed from the stack only: {step.stays_in_gcp}, and a "
                f"quota preference cannot be deleted from Google Cloud, so the cap "
                f"{inputs.get('quotaId', '')}={value} in {inputs.get('parent', '')} stays. "
                "To lift it, raise it first in its own reviewed change (keep the "
                "preference, a higher preferredValue: an update in place), or change it "
                "in the console (IAM & Admin > Quotas) after this merges.")
    return f"{step.name} will stay in GCP: {step.stays_in_gcp}."


def _empties_a_bucket(step: Step) -> bool:
    """A bucket deleted (or replaced) without forceDestroy: GCS refuses to delete a
    bucket that holds objects (noncurrent versions too)."""
    old = step.base if step.op == "replace" else step.resource
    return (step.type == STORAGE_BUCKET and step.op in ("delete", "replace")
            and not step.refused and old is not None
            and not old.get("inputs", {}).get("forceDestroy"))


def bucket_warning(step: Step) -> str:
    return (f"bucket {gcp_name(step.resource)} is deleted without forceDestroy: GCS refuses "
            "to delete a bucket that still holds objects (noncurrent versions included), "
            "and `pulumi up` stops there. Empty it first (`gcloud storage rm --recursive "
            "--all-versions`), or set storage.forceDestroy in its own reviewed change "
            "if its objects may go.")


def _replaced(step: Step) -> str:
    if is_tpu_node(step.type, step.resource.get("inputs", {})):
        return f"TPU node {node_name(step.resource)} will be REPLACED"
    return f"{step.name} will be REPLACED"


def _about(usd: float | None, unconfirmed: bool, *, signed: bool = False) -> str:
    text = money(usd, signed=signed)
    return f"~{text} (unconfirmed)" if unconfirmed and usd is not None else text


def cost_line(diff: PlanDiff) -> str:
    """Base, head and change, each "unknown" when a node is not priced, "~… (unconfirmed)"
    when a price is unconfirmed (model/catalog.py)."""
    delta = diff.usd_per_hour_delta
    either = diff.base_unconfirmed or diff.head_unconfirmed
    month = None if delta is None else round(per_month(delta) or 0.0, 2)
    return (f"TPU cost: {_about(diff.base_usd_per_hour, diff.base_unconfirmed)}/hour => "
            f"{_about(diff.head_usd_per_hour, diff.head_unconfirmed)}/hour (change "
            f"{_about(delta, either, signed=True)}/hour, {_about(month, either, signed=True)}"
            "/month; TPU nodes only, list prices)")


def unchanged_count(diff: PlanDiff) -> int:
    """Unchanged as the engine counts: the program's resources without a change, same
    steps, the stack and the default providers (report.py, STACK_RESOURCE)."""
    providers = default_providers(diff.head.get("resources", []))
    return diff.steps.counts()["same"] + STACK_RESOURCE + len(providers)


def summary(diff: PlanDiff) -> str:
    """`pulumi preview`'s "Resources:" block."""
    counts = diff.steps.counts()
    lines = [f"    {SUMMARY_WORDS[op].format(counts[op])}" for op in OPS if counts[op]]
    pieces = []
    if len(lines) >= 2:
        changes = sum(counts[op] for op in OPS)
        pieces.append(f"{changes} change{'s' if changes != 1 else ''}")
    pieces.append(f"{unchanged_count(diff)} unchanged")
    return "\n".join(["Resources:", *lines, f"    {'. '.join(pieces)}"])


def diagnostics(diff: PlanDiff) -> str:
    """The errors `pulumi preview` (or GCP, in `up`) stops with, as the preview prints
    them, and the way out."""
    lines = ["Diagnostics:"]
    for step in diff.refused:
        lines.append(f"  {display_type(step.type)} ({step.name}):")
        lines += [f"    {'error: ' if i == 0 else ''}{line}"
                  for i, line in enumerate(step.refused.splitlines())]
    lines.append(f"  {len(diff.refused)} step(s) refused: {WAY_OUT}")
    return "\n".join(lines)


WAY_OUT = ("a protected resource is replaced or deleted only after it is unprotected in its "
           "own reviewed change (protect: false, e.g. storage.protect), or with `pulumi "
           "state unprotect URN` by an operator; a GCP name still held is freed by "
           "removing its resource in an earlier change.")


def step_lines(step: Step) -> list[str]:
    """One step as `pulumi preview --diff` prints it: the prefix, type, name and
    operation, then `~ path: old => new` per property."""
    name = gcp_name(step.resource) if step.custom else ""
    how = {"replace": "replace, delete first" if step.delete_first else "replace"}.get(
        step.op, step.op)
    if step.refused:
        how += ", REFUSED"
    lines = [f"{step.marker}{display_type(step.type)}: {step.name}"
             + (f" [{name}]" if name else "")
             + f" ({how})"]
    if step.delete_first:
        lines.append(f"      delete first: {step.delete_first_because}")
    if step.stays_in_gcp:
        lines.append(f"      stays in GCP: {step.stays_in_gcp}")
    lines += [f"    ~ {describe(step, c)}" for c in step.changes]
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
    if markdown and (chart := cost_chart(diff.head, {r[0]: r[2] for r in node_rows(diff.head)})):
        parts.append(chart)  # the head's cost and capacity, where its nodes fill a screen
    if not diff.empty:
        body = "\n".join(line for s in diff.steps.steps for line in step_lines(s))
        parts.append(f"```diff\n{body}\n```" if markdown else body)
    if diff.refused:
        block = diagnostics(diff)
        parts.append("> [!CAUTION]\n" + "\n".join(f"> {line}  " for line in
                                                   block.splitlines())
                     if markdown else block)
    parts.append(f"```\n{summary(diff)}\n```" if markdown else summary(diff))
    parts.append(policy_section(violations, markdown=markdown))
    return "\n\n".join(parts) + "\n"


def step_json(diff: PlanDiff, step: Step) -> dict[str, Any]:
    return {
        "op": step.op, "urn": step.urn, "type": step.type, "name": step.name,
        "gcpName": gcp_name(step.resource), "deleteFirst": step.delete_first,
        "deleteFirstBecause": step.delete_first_because,
        "deletedBefore": step.deleted_before,
        "refused": step.refused or None,
        "staysInGcp": step.stays_in_gcp or None,
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
        "summary": {**{op: diff.steps.counts()[op] for op in OPS},
                    "unchanged": unchanged_count(diff)},
        "refused": [s.urn for s in diff.refused],
        "warnings": replacement_warnings(diff),
        "duplicateUrns": duplicate_urns(diff.head),
        "cost": {"covers": "TPU nodes only, at list prices",
                 "baseUsdPerHour": diff.base_usd_per_hour,
                 "headUsdPerHour": diff.head_usd_per_hour,
                 "deltaUsdPerHour": diff.usd_per_hour_delta,
                 "deltaUsdPerMonth": None if diff.usd_per_hour_delta is None
                 else round(per_month(diff.usd_per_hour_delta) or 0.0, 2),
                 "baseUnconfirmed": diff.base_unconfirmed,
                 "headUnconfirmed": diff.head_unconfirmed},
        "violations": [v.to_json() for v in violations],
    }


def render_diff(diff: PlanDiff, fmt: str, violations: Sequence[Violation] = ()) -> str:
    """The diff as `fmt` (markdown, table or json), with the head plan's policy results."""
    if check_format(fmt) == "json":
        return json.dumps(diff_to_json(diff, violations), indent=2, sort_keys=True) + "\n"
    return _text(diff, violations, markdown=fmt == "markdown")
