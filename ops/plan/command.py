"""The `plan` verb: render an offline plan for a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from components.settings import SettingsError
from components.stack_config import StackFileError
from ops.plan.diff import diff_plans, load_plan, render_diff
from ops.plan.offline import Plan, offline_plan
from ops.plan.report import check_format, duplicate_urns, plain, render
from policy.evaluate import evaluate, load_config

console = Console()


def print_report(result: Plan, fmt: str | None, against: Path | None) -> int:
    """The PR-comment rendering (ops/plan/report.py, ops/plan/diff.py); exit 1 on a policy
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
            if out:
                out.write_text(json.dumps(plain(result.to_json()), indent=2, sort_keys=True)
                               + "\n")
            code = print_report(result, fmt, against)
        except (SettingsError, StackFileError, ValueError) as error:
            console.print(f"[red]error:[/red] {error}", highlight=False)
            raise typer.Exit(2) from None
        if out:
            console.print(f"plan written to {out}")
        raise typer.Exit(code)
