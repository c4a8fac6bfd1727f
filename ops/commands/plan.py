"""The `plan` verb: render an offline plan for a terminal."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from components.stack_config import StackFileError
from model.fleet import TargetError
from model.settings.schema import SettingsError
from ops.plan.diff import WAY_OUT, diff_plans, load_plan, render_diff
from ops.plan.offline import Plan, PlanError, offline_plan
from ops.plan.proof import Proof, plan_proof
from ops.plan.report import check_format, duplicate_urns, plain, render
from ops.plan.screen import fit_lines, screen, terminal_columns
from ops.terminal import PROG, fail, from_caller
from ops.tpu.api import TpuApiError
from policy.evaluate import evaluate, load_config


def print_report(result: Plan, fmt: str | None, against: Path | None,
                 out: Path | None = None, live: bool = False, detail: bool = False) -> int:
    """The PR-comment rendering (ops/plan/report.py, ops/plan/diff.py) and the permission
    proof (ops/plan/proof.py); exit 1 on a policy violation, a duplicate URN, a step the
    engine (or GCP) refuses, or an operation the stack's deployer may not do. `out` gets the
    plan's JSON, the very document `--format json` prints. `live`: the candidates' quota
    headroom read from Cloud Quotas and the TPU API (ops/tpu/headroom.py)."""
    head = plain(result.to_json())
    if live and head.get("candidates"):
        head = with_live_headroom(head, result)
    violations = evaluate(head, load_config())
    if out:
        out.write_text(render(head, "json", violations))
    refused = 0
    if against:
        base = load_plan(against)
        if base.get("stack") != head["stack"]:
            print(f"{PROG}: warning: --against {against} is a plan of stack {base.get('stack')!r}, "
                  f"this one of {head['stack']!r}: the diff compares two stacks", file=sys.stderr)
        diff = diff_plans(base, head)
        refused = len(diff.refused)
        text = render_diff(diff, fmt or "markdown", violations)
    elif (fmt or "table") == "table":  # the terminal's one screen (ops/plan/screen.py)
        text = screen(head, violations, detail=detail)
    else:
        text = render(head, fmt or "table", violations)
    print(text, end="")
    proof = plan_proof(result.settings, result.run)
    print(proof_text(proof, fmt, against), file=sys.stderr if fmt == "json" else sys.stdout)
    if refused:
        print(f"{PROG}: {refused} step(s) would be refused by `pulumi up` (see Diagnostics): "
              f"{WAY_OUT}", file=sys.stderr)
    if proof.findings:
        print(f"{PROG}: {len(proof.findings)} resource operation(s) its deployer may not do "
              f"(permission proof, docs/teams.md)", file=sys.stderr)
    blocking = [v for v in violations if not v.advisory]
    return 1 if blocking or duplicate_urns(head) or refused or proof.findings else 0


def proof_text(proof: Proof, fmt: str | None, against: Path | None) -> str:
    """The proof's lines; one that did not run is a warning (a team stack without `ci`:
    nobody's rights were proved), never silence. Within COLUMNS on a terminal."""
    text = "\n".join(proof.lines())
    if proof.identity is None:
        text = f"WARNING: {text}"
    if (fmt or "table") == "table" and not against:
        text = fit_lines(text, terminal_columns())
    return text


def with_live_headroom(head: dict[str, Any], result: Plan) -> dict[str, Any]:
    """The plan with its candidates' headroom read live; each figure that stays unknown
    says why on stderr."""
    from ops.tpu.headroom import live_candidates

    live = live_candidates(result.settings, *live_source(result))
    for note in live.notes:
        print(f"{PROG}: live headroom: {note}", file=sys.stderr)
    return {**head, "candidates": live.candidates, "headroomRead": "live"}


def live_source(result: Plan) -> tuple[Any, Any, Any]:
    """(TpuApi, QuotaReader, ReservationReader) with the stack's credentials, as `tpuctl
    preflight` reads."""
    from ops.tpu.api import TpuApi
    from ops.tpu.headroom import stack_reservations
    from ops.tpu.quota import stack_reader
    from ops.tpu.target import load_target

    target = load_target(result.stack)
    return (TpuApi(auth=target.auth()), stack_reader(target, os.environ),
            stack_reservations(target, os.environ))


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        stack: str = typer.Option("dev", "--stack", "-s", help="Stack name (Pulumi.<stack>.yaml)."),
        out: Path | None = typer.Option(None, "--out", help="Also write the plan as JSON here."),
        fmt: str | None = typer.Option(
            None, "--format", metavar="FORMAT",
            help="table | markdown | json, with policy results (PR comment); default table, "
                 "markdown with --against."),
        against: Path | None = typer.Option(
            None, "--against",
            help="The engine's steps from this saved plan (`--format json` of the base)."),
        live: bool = typer.Option(
            False, "--live",
            help="Read fallback candidates' quota headroom from Cloud Quotas and the TPU "
                 "API (needs the stack's credentials); offline it is an upper bound or "
                 "unknown."),
        detail: bool = typer.Option(
            False, "--detail",
            help="On a terminal, every resource, cost line and training step besides the "
                 "summary."),
    ) -> None:
        """Offline plan of a stack: a summary, nodes, resources by team and component."""
        out, against = from_caller(out), from_caller(against)
        try:
            if fmt:
                check_format(fmt)  # before the plan runs
            result = offline_plan(stack)
            code = print_report(result, fmt, against, out, live, detail)
        except (SettingsError, StackFileError, PlanError, ValueError, OSError, TargetError,
                TpuApiError) as error:
            fail(error)
        if out:
            print(f"plan written to {out}", file=sys.stderr)
        raise typer.Exit(code)
