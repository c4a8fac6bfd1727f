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
    lines.append(f"  stack: ${cost.usd_per_hour:.2f}/h, "
                 f"${cost.usd_per_month:,.2f} per 730-hour month")
    if cost.unpriced:
        lines.append(f"  not priced (no list price in the catalog): {', '.join(cost.unpriced)}")
    return lines


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        stack: str = typer.Option("dev", "--stack", "-s", help="Stack name (Pulumi.<stack>.yaml)."),
        out: Path | None = typer.Option(None, "--out", help="Also write the plan as JSON here."),
    ) -> None:
        """Offline plan of a stack: resources by component and the cost estimate."""
        try:
            result = offline_plan(stack)
        except (SettingsError, StackFileError) as error:
            console.print(f"[red]error:[/red] {error}", highlight=False)
            raise typer.Exit(2) from None
        console.print(plan_table(result))
        console.print("Estimated cost (list prices, components/catalog.py):")
        for line in cost_lines(result):
            console.print(line, highlight=False)
        if out:
            out.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
            console.print(f"plan written to {out}")
