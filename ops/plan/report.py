"""Render an offline plan (`ops.plan.offline.Plan.to_json()`) for people: the PR comment.

Formats: `markdown` (GitHub comment), `table` (terminal), `json` (the plan plus
monthly cost and the policy results). Everything works on the plan's JSON dict,
so a plan saved by another branch renders the same way.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pulumi

from model import catalog
from model.catalog import HOURS_PER_MONTH
from model.pulumi_types import TPU_V2_VM
from ops.plan.chart import cost_chart
from policy.evaluate import Violation
from policy.tpu_policies import tpu_view

FORMATS = ("markdown", "table", "json")
NODE_COMPONENT_PREFIX = "node-"


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r} is not a format; allowed: {', '.join(FORMATS)}")
    return fmt


def plain(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The plan as pure JSON data, so a fresh plan and one read from a file compare
    equal: Pulumi assets and archives become `{"FileAsset": path}` and the like."""
    return json.loads(json.dumps(plan, default=_asset_json))


def _asset_json(value: Any) -> dict[str, Any]:
    for attribute in ("path", "text", "uri", "assets"):
        if isinstance(value, pulumi.Asset | pulumi.Archive) and hasattr(value, attribute):
            return {type(value).__name__: getattr(value, attribute)}
    raise TypeError(f"{type(value).__name__} in a plan is not JSON data")


def money(usd: float | None, *, signed: bool = False) -> str:
    """`$1.20`; `unknown` where the catalog has no price."""
    if usd is None:
        return "unknown"
    sign = "+" if signed and usd > 0 else "-" if usd < 0 else ""
    return f"{sign}${abs(usd):,.2f}"


def shown_total(plan: Mapping[str, Any], *, monthly: bool = False) -> float | None:
    """The plan's TPU cost per hour (or month) as the sum of the figures its node table
    shows, each rounded to the cent; unknown (None) when a node has no price."""
    cost = plan.get("cost", {})
    if "nodes" not in cost:
        hourly = cost.get("usdPerHour")
        return per_month(hourly) if monthly else hourly
    prices = [n.get("usdPerHour") for n in cost["nodes"]]
    if any(p is None for p in prices):
        return None
    return round(sum(round(per_month(p) if monthly else p, 2) for p in prices), 2)


def per_month(usd_per_hour: float | None) -> float | None:
    return None if usd_per_hour is None else usd_per_hour * HOURS_PER_MONTH


TERMINAL_COLUMNS = 100
MIN_COLUMN = 8


def fitted_widths(widths: list[int], total: int, gap: int = 2) -> list[int]:
    """Column widths that fit `total` characters with `gap` between columns: the widest
    column gives way first, none below MIN_COLUMN (or its own width)."""
    widths = list(widths)
    while sum(widths) + gap * (len(widths) - 1) > total:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= MIN_COLUMN:
            break
        widths[widest] -= 1
    return widths


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, markdown: bool,
          columns: int = TERMINAL_COLUMNS) -> str:
    """A markdown table, or plain aligned columns for a terminal, `columns` wide at most
    (a value too long for its column on a line of its own below its row)."""
    cells = [[str(c) for c in headers], *([str(c) for c in row] for row in rows)]
    if markdown:
        escaped = [[c.replace("|", "\\|") for c in row] for row in cells]
        lines = ["| " + " | ".join(row) + " |" for row in escaped]
        lines.insert(1, "|" + "|".join("---" for _ in headers) + "|")
        return "\n".join(lines)
    widths = fitted_widths([max(len(row[i]) for row in cells) for i in range(len(headers))],
                           columns)
    return "\n".join(line for row in cells for line in wrapped_row(row, widths, columns))


WRAPPED = "↓"  # in a cell whose value is on its own line below the row


def wrapped_row(row: Sequence[str], widths: Sequence[int], columns: int) -> list[str]:
    """A row in its columns; a value too long for its column goes whole onto a line of
    its own below, under its column (further left if it would pass `columns`), so a
    bucket, URN or project name is never cut and can be copied."""
    starts = [sum(widths[:i]) + 2 * i for i in range(len(widths))]
    long = [i for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            if len(cell) > width]
    cells = [cell[:len(cell) - len(cell.lstrip())] + WRAPPED if i in long else cell
             for i, cell in enumerate(row)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()]
    for i in long:
        lines.append(" " * max(0, min(starts[i], columns - len(row[i]))) + row[i])
    return lines


def display_type(token: str) -> str:
    """A type token as the engine's display shows it: `gcp:storage:Bucket` for
    `gcp:storage/bucket:Bucket` (pulumi/pulumi sdk/go/common/tokens/tokens.go
    Type.DisplayName @1b5949891b3c)."""
    parts = token.split(":")
    if len(parts) != 3 or not parts[2] or "/" not in parts[1]:
        return token
    package, module, name = parts
    path, _, file = module.rpartition("/")
    if file != name[:1].lower() + name[1:]:
        return token
    return f"{package}:{path}:{name}"


def heading(text: str, *, markdown: bool, level: int = 2) -> str:
    return f"{'#' * level} {text}" if markdown else f"{text}\n{'=' * len(text)}"


def accelerator_of(inputs: Mapping[str, Any]) -> str:
    """The accelerator type as users write it (`v4-32`), also for a node the API is sent
    as a shape (AcceleratorConfig `V4` + `2x2x4`); the topology follows in brackets."""
    config = inputs.get("acceleratorConfig")
    if isinstance(config, Mapping) and config.get("type"):
        topology = str(config.get("topology", ""))
        gen = next((g for g in catalog.GENERATIONS.values() if g.api_type == config["type"]),
                   None)
        if gen is None or catalog.topology_problem(gen, topology):
            return f"{config['type']} {topology}".strip()
        return f"{catalog.slice_for(gen.name, topology).accelerator_type} ({topology})"
    return str(inputs.get("acceleratorType") or "provider default")


def provisioning_of(resource: Mapping[str, Any]) -> str:
    """on-demand | spot | preemptible | reserved (V2Vm's schedulingConfig flag), or
    queued (a QueuedTpu) with its request's kind: `queued, spot` and the like."""
    inputs = resource.get("inputs", {})
    if resource["type"] == TPU_V2_VM:
        flags = inputs.get("schedulingConfig") or {}
        return next((f for f in ("spot", "preemptible", "reserved") if flags.get(f)),
                    "on-demand")
    kinds = [kind for kind, key in (("spot", "spot"), ("guaranteed", "guaranteed"),
                                    ("reserved", "reservation_name")) if inputs.get(key)]
    return ", ".join(["queued", *kinds])


def node_name(resource: Mapping[str, Any]) -> str:
    """A TPU node's logical name (`tpu-stack:nodes[].name`, as the plan's cost names
    it): its TpuNode component is `node-<name>` (components/platform.py)."""
    component = resource.get("component")
    if not component:
        return resource["name"]
    return component.rsplit(":", 1)[-1].removeprefix(NODE_COMPONENT_PREFIX)


def gcp_name(resource: Mapping[str, Any]) -> str:
    """What the resource is called in GCP (bucket, account email, node id), as far as
    the plan knows it: inputs the program sets and outputs the mock computes."""
    inputs, outputs = resource.get("inputs", {}), resource.get("outputs", {})
    kind = resource["type"].rsplit(":", 1)[-1]
    if kind == "Bucket":
        return f"gs://{inputs.get('name', '')}"
    if kind == "BucketObject":
        return f"gs://{inputs.get('bucket', '')}/{inputs.get('name', '')}"
    if kind == "Account":
        return str(outputs.get("email") or inputs.get("accountId", ""))
    if "role" in inputs:  # a grant: its role, member and target are in the JSON
        return ""
    if kind == "Service":
        return str(inputs.get("service", ""))
    if kind == "V2Vm" and inputs.get("name"):
        return f"{inputs['name']} in {inputs.get('zone', '')}"
    if "node_id" in inputs:  # a queued node (components/queued_tpu.py)
        return f"{inputs['node_id']} in {inputs.get('zone', '')}"
    for key in ("name", "accountId", "roleId", "projectId", "workloadIdentityPoolId",
                "workloadIdentityPoolProviderId", "displayName"):
        if inputs.get(key):
            return str(inputs[key])
    return ""


def node_rows(plan: Mapping[str, Any]) -> list[list[str]]:
    """One row per TPU node: name, accelerator, runtime, provisioning, cost."""
    costs = {n["name"]: n for n in plan.get("cost", {}).get("nodes", [])}
    rows = []
    for r in plan.get("resources", []):
        inputs = tpu_view(r["type"], r.get("inputs", {}))
        if inputs is None:
            continue
        name = node_name(r)
        cost = costs.get(name, {})
        saving = cost.get("spotSavingUsdPerHour")
        rows.append([name, gcp_name(r), accelerator_of(inputs),
                     str(inputs.get("runtimeVersion", "")), provisioning_of(r),
                     *node_prices(cost), "" if saving is None else money(saving)])
    return rows


def node_prices(cost: Mapping[str, Any]) -> tuple[str, str]:
    """USD/hour and USD/month cells: `~$… (unconfirmed)` for a price the catalog marks
    unconfirmed, `… via reservation` for a reserved node (model/cost.py)."""
    hourly = cost.get("usdPerHour")
    cells = [money(hourly), money(per_month(hourly))]
    if hourly is not None and cost.get("priceConfirmed") is False:
        cells = [f"~{c} (unconfirmed)" for c in cells]
    if cost.get("reserved"):
        cells = [f"{c} via reservation" for c in cells]
    if cost.get("commitment"):
        cells = [f"{c} ({cost['commitment']} commitment)" for c in cells]
    return cells[0], cells[1]


NODE_HEADERS = ("node", "GCP node", "accelerator", "runtime", "provisioning", "USD/hour",
                "USD/month", "spot saving USD/hour")


def node_tables(plan: Mapping[str, Any], *, markdown: bool,
                columns: int = TERMINAL_COLUMNS) -> list[str]:
    """The node table; on a terminal, as two (what runs, what it costs) that fit."""
    rows = node_rows(plan)
    if markdown:
        return [table(NODE_HEADERS, rows, markdown=True)]
    if not rows:
        return []
    split = NODE_HEADERS.index("USD/hour")
    return ["\n\n".join([
        table(NODE_HEADERS[:split], [r[:split] for r in rows], markdown=False, columns=columns),
        table((NODE_HEADERS[0], *NODE_HEADERS[split:]), [[r[0], *r[split:]] for r in rows],
              markdown=False, columns=columns)])]


STEP_HEADERS = ("node", "model", "batch", "step seconds", "USD/step", "USD/1,000 steps",
                "unconfirmed")


def significant(value: float, digits: int = 2) -> str:
    """`value` in fixed notation to `digits` significant digits, or to the unit where it
    has more: 0.00021, 0.042, 12, 1,234."""
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def step_money(usd: float | None) -> str:
    """A step's cost: cents from $1 up, else two significant digits ($0.00021)."""
    if usd is None or usd >= 1:
        return money(usd)
    return f"${significant(usd)}"


def step_rows(plan: Mapping[str, Any]) -> list[list[str]]:
    """One row per node whose job the plan knows: a training step's estimated seconds
    and cost at the node's rate (model/cost.py StepCost), `~` where unconfirmed."""
    rows = []
    for node in plan.get("cost", {}).get("nodes", []):
        step = node.get("step")
        if step is None:
            continue
        unsure = step.get("unconfirmed", [])
        about_time = "~" if {"utilisation", "peak"} & set(unsure) else ""
        about_usd = "~" if unsure and step.get("usd") is not None else ""
        rows.append([node["name"], step["model"],
                     str(step["globalBatchSize"]), f"{about_time}{significant(step['seconds'])}",
                     about_usd + step_money(step.get("usd")),
                     about_usd + step_money(step.get("usdPer1000Steps")), ", ".join(unsure)])
    return rows


def step_tables(plan: Mapping[str, Any], *, markdown: bool,
                columns: int = TERMINAL_COLUMNS) -> list[str]:
    """The cost of a training step per node, or nothing for a plan without it."""
    rows = step_rows(plan)
    return [table(STEP_HEADERS, rows, markdown=markdown, columns=columns),
            *recipe_lines(plan)] if rows else []


def recipe_lines(plan: Mapping[str, Any]) -> list[str]:
    """The learning rate and optimizer each node's job trains with (the job's `recipe`
    line, tpu_training.config.recipe), one line per node."""
    lines = [f"- {node['name']}: {node['step']['recipe']}"
             for node in plan.get("cost", {}).get("nodes", [])
             if node.get("step", {}).get("recipe")]
    return ["\n".join(["Training recipe per job:", *lines])] if lines else []


def step_line(cost: Mapping[str, Any]) -> str | None:
    """How the step table's figures are made, with their assumption."""
    steps = [n["step"] for n in cost.get("nodes", []) if n.get("step")]
    if not steps:
        return None
    utilisation = steps[0]["assumedUtilization"]
    return (f"- a training step: the job's FLOPs per example x globalBatchSize over the "
            f"slice's peak bf16 FLOPs at an assumed {utilisation:.0%} utilisation "
            f"(unconfirmed; the stop budget's estimate, model/stop_save.py), at the "
            f"node's hourly price; a lower bound where input or per-step overhead dominates")


def cost_summary(plan: Mapping[str, Any]) -> str:
    cost = plan.get("cost", {})
    hourly = shown_total(plan)
    about = "~" if cost.get("unconfirmed") and hourly is not None else ""
    monthly = shown_total(plan, monthly=True)
    lines = [f"Estimated cost: {about}{money(hourly)}/hour, {about}{money(monthly)}"
             f"/month ({HOURS_PER_MONTH} h) at list prices; TPU nodes only (buckets, network "
             "and logging are not priced)"]
    lines += [f"- team {team}: {money(c.get('usdPerHour'))}/hour, "
              f"{money(per_month(c.get('usdPerHour')))}/month"
              for team, c in sorted(cost.get("byTeam", {}).items())]
    if cost.get("reserved"):
        lines.append(f"- billed through their reservation, at the on-demand rate whether or not "
                     f"the node runs (reservations-overview; unconfirmed for TPUs): "
                     f"{', '.join(cost['reserved'])}")
    if rates := rates_line(cost):
        lines.append(rates)
    if step := step_line(cost):
        lines.append(step)
    if cost.get("unconfirmed"):
        lines.append(f"- priced from an unconfirmed list price (~): "
                     f"{', '.join(cost['unconfirmed'])}")
    if cost.get("unpriced"):
        lines.append(f"- not priced (no list price in model/catalog.py): "
                     f"{', '.join(cost['unpriced'])}")
    sources = sorted({n["priceSource"] for n in cost.get("nodes", []) if n.get("priceSource")})
    if sources:
        lines.append(f"- prices per chip-hour from {'; '.join(sources)}")
    return "\n".join(lines)


def spend_section(plan: Mapping[str, Any]) -> str | None:
    """Per team: the burn rate, how long the budget lasts at it, what a budget stop
    deletes, and each node's run-time limits (the plan's `spend`, model/meter.py)."""
    teams = plan.get("spend") or {}
    if not teams:
        return None
    lines = ["Spend per team (the meter: TPU list prices)"]
    for team, p in sorted(teams.items()):
        line = f"- team {team}: burn {money(p.get('usdPerHour'))}/hour"
        budget, hours = p.get("budgetUsdPerMonth"), p.get("hoursToBudget")
        if budget is not None:
            spent = "not reached: none of its nodes runs here" if hours is None else \
                f"reached in {hours:,.0f} h ({hours / 24:,.1f} days) at this rate"
            line += f"; budget {money(budget)}/month, {spent}"
        if p.get("budgetAction") == "stop":
            deletes = ", ".join(p.get("budgetStopDeletes") or []) or "no node of this stack"
            line += (f"; budgetAction stop: a budget stop saves and deletes {deletes} (and "
                     f"every node labelled team={team} in its project)")
        lines.append(line)
        if held := p.get("held"):
            lines.append(f"  - held: a budget stop in {held['interval']} keeps "
                         f"{', '.join(held['nodes'])} out of this plan until {held['until']} "
                         f"or tpu-stack:teams.{team}.liftBudgetHold: '{held['interval']}'")
        for node in p.get("nodes") or []:
            lines.append(f"  - {node['node']}: maxRuntime {node.get('maxRuntime') or '-'}, "
                         f"idleStop {node.get('idleStop') or '-'}")
    return "\n".join(lines)


RATE_NAMES = {"onDemand": "on-demand", "spot": "spot", "oneYear": "1-year commitment",
              "threeYear": "3-year commitment"}


def rates_line(cost: Mapping[str, Any]) -> str | None:
    """The stack's nodes at every rate side by side (model/cost.py RATES), `~` where a
    price is unconfirmed; None for a plan without them."""
    by_rate = cost.get("byRate")
    if not by_rate:
        return None
    nodes = cost.get("nodes", [])
    unsure = {"onDemand": any(n.get("priceConfirmed") is False and not n.get("commitment")
                              for n in nodes),
              "oneYear": any(n.get("committedConfirmed") is False for n in nodes)}
    unsure |= {"spot": unsure["onDemand"], "threeYear": unsure["oneYear"]}
    cells = [f"{name} {'~' if unsure[rate] else ''}{money(by_rate.get(rate))}/hour"
             for rate, name in RATE_NAMES.items()]
    return "- the same nodes at each rate: " + ", ".join(cells)


def duplicate_urns(plan: Mapping[str, Any]) -> list[str]:
    """URNs declared more than once: `pulumi up` stops with "Duplicate resource URN"."""
    counts = Counter(r["urn"] for r in plan.get("resources", []))
    return sorted(urn for urn, count in counts.items() if count > 1)


def duplicates_section(plan: Mapping[str, Any], *, markdown: bool) -> list[str]:
    """A loud error block, or nothing when every URN is unique."""
    duplicates = duplicate_urns(plan)
    if not duplicates:
        return []
    lines = ["ERROR: resources share a URN (a child named alike in two components); "
             "`pulumi up` will fail with \"Duplicate resource URN\":",
             *(f"- `{urn}`" if markdown else f"- {urn}" for urn in duplicates)]
    if markdown:
        return ["> [!CAUTION]\n" + "\n".join(f"> {line}" for line in lines)]
    return ["\n".join(lines)]


# Headroom: chips left of the quota (limit − usage − the plan's other nodes) and of the
# reservation; the quota's id is in the plan's JSON (`candidates`).
CANDIDATE_HEADERS = ("node", "#", "zone", "type", "provisioning", "USD/h", "USD/1k steps",
                     "quota left", "resv. left")


def candidate_tables(plan: Mapping[str, Any], *, markdown: bool,
                     columns: int = TERMINAL_COLUMNS) -> list[str]:
    """Each node with fallback: its candidates in order (model/candidates.py)."""
    rows = [[name if row["position"] == 1 else "", str(row["position"]), row["zone"],
             row["acceleratorType"], row["provisioning"], money(row["usdPerHour"]),
             step_money(row["usdPer1000Steps"]), row["quotaHeadroom"],
             row["reservationHeadroom"]]
            for name, node_rows_ in plan.get("candidates", {}).items() for row in node_rows_]
    if not rows:
        return []
    title = "fallback candidates, tried in order"
    if plan.get("headroomRead") == "live":
        title += " (quota headroom read live: Cloud Quotas' limit less the project's usage)"
    return [heading(title, markdown=markdown, level=3),
            table(CANDIDATE_HEADERS, rows, markdown=markdown, columns=columns)]


def warnings_section(plan: Mapping[str, Any], *, markdown: bool) -> list[str]:
    """The plan's warnings (a stop save that may not fit its notice, a node reading its
    data across regions), or nothing."""
    warnings = list(dict.fromkeys(plan.get("warnings", [])))  # each text once
    if not warnings:
        return []
    if markdown:
        return ["> [!WARNING]\n" + "\n".join(f"> {w}  " for w in warnings)]
    return ["\n".join(f"WARNING: {w}" for w in warnings)]


def policy_section(violations: Sequence[Violation], *, markdown: bool) -> str:
    if not violations:
        return "Policy pack: every guardrail passes."
    lines = [f"Policy pack: {len(violations)} violation(s)"]
    for v in violations:
        resource = v.urn.rsplit("::", 1)[-1] if v.urn else "stack"
        level = " (advisory)" if v.advisory else ""
        lines.append(f"- {'**' + v.policy + '**' if markdown else v.policy}{level} "
                     f"({resource}): {v.message}")
    return "\n".join(lines)


# What `pulumi preview` counts (its summary, pulumi/pulumi pkg/backend/display/diff.go
# renderSummaryEvent: one step per resource the engine registers): the program's resources,
# components included, plus the stack itself and one default provider per package the
# custom resources use without an explicit provider (unconfirmed for the count of
# default providers: read from a stack's state, not code).
STACK_RESOURCE = 1


def default_providers(resources: Iterable[Mapping[str, Any]]) -> set[str]:
    """The packages whose default provider the engine registers (gcp, random, ...)."""
    return {r["type"].split(":", 1)[0] for r in resources
            if r.get("custom", True) and not r.get("provider")
            and not r["type"].startswith("pulumi:")}  # builtins: no default provider


def preview_count(plan: Mapping[str, Any]) -> str:
    """The plan's headline: how many resources `pulumi preview` counts, and of what."""
    resources = plan.get("resources", [])
    custom = sum(1 for r in resources if r.get("custom", True))
    providers = len(default_providers(resources))
    total = len(resources) + STACK_RESOURCE + providers
    return (f"{total} resources (pulumi preview's count): {custom} in GCP, "
            f"{len(resources) - custom} components, the stack, {providers} default "
            f"provider{'s' if providers != 1 else ''}")


def _resource_rows(plan: Mapping[str, Any]) -> list[list[str]]:
    return [[r["name"], gcp_name(r), display_type(r["type"]), r.get("component") or "",
             "yes" if r.get("protect") else ""]
            for r in plan.get("resources", []) if r.get("custom", True)]


def resource_table(rows: list[list[str]], columns: int = TERMINAL_COLUMNS) -> str:
    """The terminal's resource table: rows under a `[component]` line each, so the
    component takes no column of its own and the table fits TERMINAL_COLUMNS."""
    grouped: list[list[str]] = []
    for component in dict.fromkeys(row[3] for row in rows):
        grouped.append([f"[{component or 'stack'}]", "", "", ""])
        grouped += [[f"  {row[0]}", row[1], row[2], row[4]] for row in rows
                    if row[3] == component]
    return table(("resource", "GCP name", "type", "protected"), grouped, markdown=False,
                 columns=columns)


def _text(plan: Mapping[str, Any], violations: Sequence[Violation], *, markdown: bool) -> str:
    resources = _resource_rows(plan)
    parts = [
        heading(f"tpu-stack plan: {plan.get('stack')} ({plan.get('project')})", markdown=markdown),
        *duplicates_section(plan, markdown=markdown),
        *warnings_section(plan, markdown=markdown),
        policy_section(violations, markdown=markdown),
        cost_summary(plan),
        *([section] if (section := spend_section(plan)) else []),
        *node_tables(plan, markdown=markdown),
        *([chart] if markdown and (chart := cost_chart(plan, {r[0]: r[2] for r in node_rows(plan)}))
          else []),
        *step_tables(plan, markdown=markdown),
        *candidate_tables(plan, markdown=markdown),
        preview_count(plan),
        table(("resource", "GCP name", "type", "component", "protected"), resources,
              markdown=True) if markdown else resource_table(resources),
    ]
    if markdown:
        # Folded: a PR comment leads with nodes, cost and policy.
        parts[-1] = f"<details><summary>resources</summary>\n\n{parts[-1]}\n\n</details>"
    return "\n\n".join(parts) + "\n"


def to_json(plan: Mapping[str, Any], violations: Sequence[Violation]) -> dict[str, Any]:
    cost = dict(plan.get("cost", {}))
    # The totals the text shows: sums of the rounded node figures, unknown when a node
    # has no price.
    cost["usdPerHour"] = shown_total(plan)
    cost["usdPerMonth"] = shown_total(plan, monthly=True)
    cost["hoursPerMonth"] = HOURS_PER_MONTH
    return {**plan, "cost": cost, "violations": [v.to_json() for v in violations],
            "duplicateUrns": duplicate_urns(plan)}


def render(plan: Mapping[str, Any], fmt: str, violations: Sequence[Violation] = ()) -> str:
    """The plan as `fmt` (markdown, table or json), with cost and policy results."""
    plan = plain(plan)
    if check_format(fmt) == "json":
        return json.dumps(to_json(plan, violations), indent=2, sort_keys=True) + "\n"
    return _text(plan, violations, markdown=fmt == "markdown")
