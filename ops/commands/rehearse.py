"""`tpuctl rehearse`: the verb; the rehearsal itself is ops/rehearse/rehearsal.py."""

from __future__ import annotations

from pathlib import Path

import typer

from ops.rehearse import rehearsal
from ops.rehearse.rehearsal import DEFAULT_BATCH, DEFAULT_STEPS
from ops.terminal import console as make_console
from ops.terminal import from_caller


def register(app: typer.Typer) -> None:
    @app.command("rehearse")
    def rehearse_command(
        stack: str = typer.Option("dev", "--stack", "-s", help="Stack name (Pulumi.<stack>.yaml)."),
        node: str | None = typer.Option(
            None, "--node", help="Logical node name (default: every node, one after another)."),
        workdir: Path | None = typer.Option(
            None, "--workdir", help="Where everything lands, a folder per node (default "
                                    ".cache/rehearse/<stack>)."),
        steps: int | None = typer.Option(
            None, "--steps", min=1, help=f"Train this many steps (default {DEFAULT_STEPS})."),
        batch: int | None = typer.Option(
            None, "--batch", min=1, help=f"Global batch size on CPU (default {DEFAULT_BATCH})."),
        data: Path | None = typer.Option(
            None, "--data", help="A folder of your own records, named as the job's trainData "
                                 "and evalData patterns name them (default: synthetic ones)."),
    ) -> None:
        """Boot the stack's TPU nodes here: emulated GCS and metadata, the real job on CPU."""
        raise typer.Exit(rehearsal.rehearse(stack, workdir=from_caller(workdir),
                                            console=make_console(), node=node, steps=steps,
                                            batch=batch, data=from_caller(data)))
