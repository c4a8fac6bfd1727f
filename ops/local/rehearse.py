"""`tpuctl rehearse`: boot a stack's TPU node on this machine, offline, end to end.

The node's metadata comes from the stack's offline plan (the exact values the
TpuNode declares), the package is the archive the stack would upload, served by
a GCS emulator; a loopback metadata server answers the bootstrap, which installs
the package and runs the real job on CPU over a synthetic dataset.

Two honest differences from the VM, both printed: TensorFlow's gs:// filesystem
cannot be pointed at an emulator, so the job's gs:// locations become local
folders; and the job runs a few executions instead of the stack's trainSteps.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from components.agent import (
    JOB_KEY,
    PACKAGE_KEY,
    PACKAGE_SHA256_KEY,
    STARTUP_SCRIPT_KEY,
    STATUS_KEY,
)
from components.archive import REPO_ROOT, build_archive
from components.settings import SettingsError
from components.stack_config import StackFileError
from ops.local.local_node import LocalNode
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator, split
from ops.plan.offline import Plan, offline_plan

TRAINING_PYTHON = REPO_ROOT / ".venv" / "tf218" / "bin" / "python"
LOCATION_KEYS = ("trainData", "evalData", "checkpointDir", "exportDir", "tensorboardDir")
DEFAULT_STEPS = 40
DEFAULT_BATCH = 64
EXECUTIONS = 4  # status updates during a rehearsal: one per execution
POLL_SECONDS = 0.5


class RehearsalError(RuntimeError):
    """The rehearsal cannot start; the text says why and what to change."""


def planned_nodes(plan: Plan) -> dict[str, dict[str, str]]:
    """Each TPU node's metadata by its TpuNode's name (`node-trainer`): whatever
    resource carries a startup-script (a V2Vm, or a QueuedTpu's node)."""
    nodes = {}
    for resource in plan.run.registrations:
        metadata = resource.inputs.get("metadata")
        if isinstance(metadata, dict) and STARTUP_SCRIPT_KEY in metadata:
            component = plan.component_of(resource) or resource.name
            nodes[component.split(":")[-1]] = dict(metadata)
    return nodes


def pick_node(nodes: dict[str, dict[str, str]], node: str | None) -> tuple[str, dict[str, str]]:
    if not nodes:
        raise RehearsalError("the stack declares no TPU node (tpu-stack:nodes is empty)")
    # TpuNode names carry a prefix before the logical name (components/platform.py).
    matches = [name for name in nodes if node is None or name == node or name.endswith(f"-{node}")]
    if not matches:
        raise RehearsalError(f"--node {node!r}: the stack's nodes are {', '.join(nodes)}")
    return matches[0], nodes[matches[0]]


def local_path(uri: str, gcs_root: Path) -> str:
    """Where a gs:// location lives during the rehearsal (other paths stay as they are)."""
    if not uri.startswith("gs://"):
        return uri
    bucket, name = split(uri)
    return str(gcs_root / bucket / name) + ("/" if uri.endswith("/") else "")


def rehearsal_job(job: dict[str, Any], gcs_root: Path, steps: int | None = None,
                  batch: int | None = None) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """The job with local locations and a CPU-sized run; what changed (key -> (from, to)).

    A TPU-sized job (a 1024 batch for thousands of steps) takes hours on a CPU;
    the rehearsal checks the boot, so it trains a few executions of a small batch.
    """
    local = dict(job)
    for key in LOCATION_KEYS:
        if job.get(key):
            local[key] = local_path(job[key], gcs_root)
    train = min(job["trainSteps"], steps or DEFAULT_STEPS)
    per_execution = min(job.get("stepsPerExecution", 100), max(1, train // EXECUTIONS))
    local |= {"trainSteps": train // per_execution * per_execution,
              "stepsPerExecution": per_execution,
              "checkpointEverySteps": per_execution,
              "globalBatchSize": min(job["globalBatchSize"], batch or DEFAULT_BATCH)}
    changed = {key: (str(job.get(key)), str(local[key])) for key in local
               if local[key] != job.get(key)}
    return local, changed


def write_dataset(job: dict[str, Any], console: Console) -> None:
    """A synthetic dataset where the job's trainData pattern will find it."""
    pattern = job["trainData"]
    out = Path(pattern).parent
    examples = max(512, 2 * job["globalBatchSize"])
    console.print(f"synthetic data: {examples} {job['model']} examples into {out}")
    result = subprocess.run([str(TRAINING_PYTHON), "-m", "tpu_training", "synth", "--model",
                             job["model"], "--out", str(out), "--examples", str(examples),
                             "--shards", "2"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RehearsalError(f"tpu_training synth failed: {result.stderr.strip()[-400:]}")
    if not glob.glob(pattern):
        raise RehearsalError(f"trainData {pattern!r} matches none of the synthetic files in "
                             f"{out} ({', '.join(sorted(p.name for p in out.iterdir()))})")


def serve_package(gcs: StorageEmulator, metadata: dict[str, str]) -> None:
    """The archive the stack would upload, at the URI the node is told."""
    archive = build_archive()
    if archive.sha256 != metadata[PACKAGE_SHA256_KEY]:
        raise RehearsalError("training/ changed while planning; run the rehearsal again")
    for uri in (metadata[PACKAGE_KEY], metadata[STATUS_KEY]):
        bucket, _ = split(uri)
        gcs.create_bucket(bucket)
    gcs.upload(metadata[PACKAGE_KEY], archive.data)


def follow(boot: subprocess.Popen[str], node: LocalNode, total: int, console: Console) -> int:
    """A progress bar of the node's guest attributes until the bootstrap exits."""
    columns = (TextColumn("[bold]{task.description:<12}"), BarColumn(),
               TextColumn("step {task.completed:.0f}/{task.total:.0f}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("booting", total=total)
        while boot.poll() is None:
            guest = node.guest
            progress.update(task, description=guest.get("state", "booting"),
                            completed=int(guest.get("step", 0)))
            time.sleep(POLL_SECONDS)
        guest = node.guest
        progress.update(task, description=guest.get("state", "?"),
                        completed=int(guest.get("step", 0)))
    return boot.returncode


def keep_status(gcs: StorageEmulator, prefix: str, workdir: Path) -> Path:
    """Copy the status objects out of the (in-memory) emulator before it stops."""
    out = workdir / "status-objects"
    for uri in gcs.names(prefix):
        target = out / uri.removeprefix(prefix)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gcs.read(uri) or b"")
    return out


def landed(node: LocalNode, job: dict[str, Any], changed: dict[str, tuple[str, str]],
           status_dir: Path, status_prefix: str, workdir: Path) -> list[str]:
    """Where each output went: the VM's location, then this machine's."""
    lines = []
    for key in ("checkpointDir", "exportDir", "tensorboardDir"):
        if key in changed:
            folder = Path(job[key])
            entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
            lines.append(f"{key}: {changed[key][0]}\n  here: {folder} [{shown or 'empty'}]")
    lines.append(f"status and job log: {status_prefix}worker-0/\n  here: {status_dir}/worker-0/ "
                 f"(status.json, job.log)")
    guest = " ".join(f"{key}={value}" for key, value in sorted(node.guest.items()))
    lines.append(f"guest attributes tpu-stack/*: {guest}")
    lines.append(f"node disk (/opt/tpu-stack on the VM): {node.root}")
    lines.append(f"bootstrap output (the startup-script journal on the VM): "
                 f"{workdir / 'bootstrap.log'}")
    return lines


def rehearse(stack: str, *, workdir: Path | None, console: Console, node: str | None = None,
             steps: int | None = None, batch: int | None = None) -> int:
    """Boot the stack's node here; the bootstrap's exit code (0 finished, 75 stopped)."""
    try:
        plan = offline_plan(stack)
        name, metadata = pick_node(planned_nodes(plan), node)
    except (SettingsError, StackFileError, RehearsalError) as error:
        console.print(f"[red]rehearse: {error}")
        return 2
    workdir = workdir or REPO_ROOT / ".cache" / "rehearse" / stack
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    job, changed = rehearsal_job(json.loads(metadata[JOB_KEY]), workdir / "gcs", steps,
                                 batch)
    console.print(f"[bold]rehearsing {name} of stack {stack}[/] in {workdir}")
    console.print("TensorFlow's gs:// filesystem cannot reach a GCS emulator, so the job's "
                  "gs:// locations are local folders here; and the run is CPU-sized:")
    for key, (before, after) in changed.items():
        console.print(f"  {key}: {before} -> {after}")
    try:
        write_dataset(job, console)
        with StorageEmulator() as gcs:
            serve_package(gcs, metadata)
            return boot(gcs, metadata | {JOB_KEY: json.dumps(job, sort_keys=True)}, job,
                        changed, workdir, console)
    except RehearsalError as error:
        console.print(f"[red]rehearse: {error}")
        return 2


def boot(gcs: StorageEmulator, metadata: dict[str, str], job: dict[str, Any],
         changed: dict[str, tuple[str, str]], workdir: Path, console: Console) -> int:
    attributes = metadata | {"agent-worker-number": "0"}
    with MetadataServer(attributes, instance_name="rehearsal") as server, \
            (workdir / "bootstrap.log").open("w") as output:
        node = LocalNode(server, workdir / "node", gcs.host)
        console.print(f"booting: package {metadata[PACKAGE_KEY]} from the emulator, "
                      f"python {node.env['TPU_STACK_PYTHON']} (TPU_STACK_STRATEGY=cpu)")
        process = node.start(stdout=output, stderr=subprocess.STDOUT)
        try:
            code = follow(process, node, job["trainSteps"], console)
        except KeyboardInterrupt:
            process.terminate()  # the agent stops the job with a checkpoint
            code = process.wait()
        status_dir = keep_status(gcs, metadata[STATUS_KEY], workdir)
        for line in landed(node, job, changed, status_dir, metadata[STATUS_KEY], workdir):
            console.print(line, overflow="fold", highlight=False, markup=False)
    colour = "green" if code == 0 else "red"
    console.print(f"[{colour}]bootstrap exited with {code} "
                  f"(state {node.guest.get('state', '?')})")
    return code


def register(app: typer.Typer) -> None:
    @app.command("rehearse")
    def rehearse_command(
        stack: str = typer.Option("dev", "--stack", "-s", help="Stack name (Pulumi.<stack>.yaml)."),
        node: str | None = typer.Option(None, "--node", help="Logical node name (default: first)."),
        workdir: Path | None = typer.Option(
            None, "--workdir", help="Where everything lands (default .cache/rehearse/<stack>)."),
        steps: int | None = typer.Option(
            None, "--steps", help=f"Train this many steps (default {DEFAULT_STEPS})."),
        batch: int | None = typer.Option(
            None, "--batch", help=f"Global batch size on CPU (default {DEFAULT_BATCH})."),
    ) -> None:
        """Boot the stack's TPU node on this machine: emulated GCS and metadata, real job on CPU."""
        raise typer.Exit(rehearse(stack, workdir=workdir, console=Console(), node=node,
                                  steps=steps, batch=batch))
