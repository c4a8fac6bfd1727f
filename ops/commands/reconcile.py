"""`tpuctl reconcile --stack S`: the plan the controller would apply to the stack, from
the same planner (ops/controller/plan.py); `--apply` acts, taking the controller's lease in
its bucket so it never acts beside a cloud run. Also the controller's last run."""

from __future__ import annotations

from datetime import datetime, timezone

import typer
from rich.table import Table
from rich.text import Text

from model.manifest import Manifest
from ops.commands.tpu import ApplyOption, StackOption, clear_errors
from ops.controller.run import last_run_lines, run_once
from ops.controller.store import Store
from ops.terminal import console as make_console
from ops.tpu import logs as agent_logs
from ops.tpu.target import load_target

console = make_console()


def reconcile_cmd(
    stack: str = StackOption,
    apply: bool = ApplyOption,
    bucket: str | None = typer.Option(
        None, "--bucket", metavar="BUCKET",
        help="The controller's bucket (default: the stack's artifacts bucket)."),
    idle_minutes: float | None = typer.Option(
        None, "--idle-minutes", min=0,
        metavar="MINUTES",
        help="Stop nodes idle this long (only those whose agent reported)."),
) -> None:
    """The controller's plan for the stack: placement, limits, budgets; each step with
    its reason (dry run unless --apply)."""
    with clear_errors():
        target = load_target(stack)
        storage = agent_logs.AgentLogs(target.project, auth=target.auth()).client
        store = Store(storage, bucket or target.artifacts_bucket)
        from ops.tpu.api import TpuApi

        result = run_once(store, TpuApi(auth=target.auth()), apply=apply,
                          manifests=[Manifest(target, idle_minutes)])
        _show(result.record, apply)
        if not apply:
            lines, _stale = last_run_lines(_quiet_last_run(store), datetime.now(timezone.utc))
            for line in lines:
                console.print(Text(line))


def _show(record: dict, apply: bool) -> None:
    for problem in [*record.get("problems", []), *record.get("unread", [])]:
        console.print(Text(f"note: {problem}"))
    if apply and not record.get("leased"):
        console.print("another controller run holds the lease: nothing done; try again "
                      "in a few minutes")
        return
    steps = record.get("steps") or []
    if not steps:
        console.print(f"nothing to do: stack {', '.join(record.get('stacks') or [])} is as "
                      f"declared" if apply else "nothing to do")
        return
    table = Table(title="changes" if apply else "dry run: the controller would")
    for column in ("step", "node", "zone", "reason", *(("result",) if apply else ())):
        table.add_column(column)
    for step in steps:
        table.add_row(step["verb"], step["node"], step["zone"], Text(step["reason"]),
                      *((Text(f"{step['result']} {step.get('detail', '')}".strip()),)
                        if apply else ()))
    console.print(table)
    if not apply:
        console.print("dry run: nothing changed; run again with --apply")


def _quiet_last_run(store: Store) -> dict | None:
    try:
        return store.last_run()
    except Exception:  # no access to the bucket: status without the controller's line
        return None


def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile_cmd)

