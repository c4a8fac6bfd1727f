"""The `plan` verb: render an offline plan for a terminal."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from components.settings import SettingsError
from components.stack_config import StackFileError
from ops.plan import Plan, offline_plan
from ops.plan_diff import diff_plans, load_plan, render_diff
from ops.plan_report import check_format, duplicate_urns, plain, render
from policy.evaluate import evaluate, load_config

console = Console()


def plan_table(plan: Plan) -> Table:
    table = Table(title=f"tpu-stack plan: stack {plan.stack} ({plan.settings.gcp_project})")
    for column in ("component", "type", "name", "notes"):
        table.add_column(column)
    groups: dict[str, list] = defaultdict(list)
    for resource in plan.run.registrations:
        if resource.custom:
            groups[plan.component_of(resource) or "-"].append(resource)
    for component in sorted(groups):
        for resource in sorted(groups[component], key=lambda r: (r.type, r.name)):
            notes = ", ".join(n for n, on in (("protected", resource.protect),
                                              ("delete-before-replace",
                                               resource.delete_before_replace)) if on)
            table.add_row(component, resource.type, resource.name, notes)
    return table


def cost_lines(plan: Plan) -> list[str]:
    cost = plan.cost
    lines = [f"  {n.name}: {n.chips} chips, "
             + (f"${n.usd_per_hour:.2f}/h" if n.usd_per_hour is not None else "no list price")
             for n in cost.nodes]
    lines += [f"  team {team}: ${c.usd_per_hour:.2f}/h, ${c.usd_per_month:,.2f} per month"
              for team, c in cost.by_team().items()]
    lines.append(f"  stack: ${cost.usd_per_hour:.2f}/h, "
                 f"${cost.usd_per_month:,.2f} per 730-hour month")
    if cost.unpriced:
        lines.append(f"  not priced (no list price in the catalog): {', '.join(cost.unpriced)}")
    return lines


def print_report(result: Plan, fmt: str | None, against: Path | None) -> int:
    """The PR-comment rendering (ops/plan_report.py, ops/plan_diff.py); exit 1 on a policy
    violation or a duplicate URN."""
    head = plain(result.to_json())
    violations = evaluate(head, load_config())
    if against:
        text = render_diff(diff_plans(load_plan(against), head), fmt or "markdown", violations)
    else:
        text = render(head, fmt or "table", violations)
    print(text, end="")
    return 1 if violations or duplicate_urns(head) else 0


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        stack: str = typer.Option("dev", "--stack", "-s", help="Stack name (Pulumi.<stack>.yaml)."),
        out: Path | None = typer.Option(None, "--out", help="Also write the plan as JSON here."),
        fmt: str | None = typer.Option(
            None, "--format", help="markdown | table | json, with policy results (PR comment)."),
        against: Path | None = typer.Option(
            None, "--against", help="Diff against this saved plan (`--format json` of the base)."),
    ) -> None:
        """Offline plan of a stack: resources by component and the cost estimate."""
        try:
            if fmt:
                check_format(fmt)  # before the plan runs
            result = offline_plan(stack)
            if fmt or against:
                raise typer.Exit(print_report(result, fmt, against))
        except (SettingsError, StackFileError, ValueError) as error:
            console.print(f"[red]error:[/red] {error}", highlight=False)
            raise typer.Exit(2) from None
        console.print(plan_table(result))
        console.print("Estimated cost (list prices, components/catalog.py):")
        for line in cost_lines(result):
            console.print(line, highlight=False)
        if out:
            out.write_text(json.dumps(plain(result.to_json()), indent=2, sort_keys=True) + "\n")
            console.print(f"plan written to {out}")
