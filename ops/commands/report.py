"""`tpuctl report --stack S`: one self-contained HTML page of plots (step, loss, goodput,
spend over the job's seconds) from what the stack's last rehearsal left, offline."""

from __future__ import annotations

from pathlib import Path

import typer

from model.fleet import TargetError
from ops.report.history import stack_history
from ops.report.page import render
from ops.terminal import console as make_console
from ops.terminal import fail, from_caller
from ops.tpu import status as node_status
from ops.tpu.target import load_target

REPORT_NAME = "report.html"


def write_report(stack: str, out: Path | None = None) -> Path:
    """Write the stack's report; its path. TargetError without a rehearsal to show."""
    target = load_target(stack)
    stack_dir = node_status.rehearsal_dir(stack)
    histories = stack_history(target, stack_dir)
    if not histories:
        raise TargetError(node_status.no_rehearsal(stack, stack_dir))
    path = out or stack_dir / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(stack, f"the rehearsal in {stack_dir} (offline)", histories),
                    encoding="utf-8")
    return path


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_command(
        stack: str = typer.Option("dev", "--stack", "-s", metavar="NAME",
                                  help="Stack name (Pulumi.<stack>.yaml)."),
        out: Path = typer.Option(None, "--out", "-o", metavar="FILE",
                                 help="Where to write the page (default: report.html in the "
                                      "stack's rehearsal folder, .cache/rehearse/<stack>/)."),
    ) -> None:
        """Plots of step, loss, goodput and spend over time, as one HTML file that opens
        offline (inline SVG, no network), from the stack's last rehearsal."""
        try:
            path = write_report(stack, from_caller(out))
        except (TargetError, OSError) as error:
            fail(error)
        make_console().print(f"wrote {path}", markup=False, soft_wrap=True)
