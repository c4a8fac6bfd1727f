"""`tpuctl rehearse`: boot a stack's TPU node on this machine, offline, end to end.

The node's metadata comes from the stack's offline plan (the exact values the
TpuNode declares), the package is the archive the stack would upload, served by
a GCS emulator; a loopback metadata server answers the bootstrap, which installs
the package and runs the real job on CPU over a synthetic dataset.

Two honest differences from the VM, both printed: TensorFlow's gs:// filesystem
cannot be pointed at an emulator, so the job's gs:// locations become local
folders; and the job is CPU-sized: a few executions instead of the stack's
trainSteps, a small batch, a narrow model (its checkpoints stay small) and,
for ResNets, small images.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from components.archive import REPO_ROOT, PackageError, build_archive
from components.settings import SettingsError
from components.stack_config import StackFileError
from node_agent import (
    JOB_KEY,
    NODE_KEY,
    PACKAGE_KEY,
    PACKAGE_SHA256_KEY,
    RELEASE_KEY,
    STARTUP_SCRIPT_KEY,
    STATUS_KEY,
)
from ops.local.local_node import LocalNode, publish_release
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator, split
from ops.plan.offline import Plan, PlanError, offline_plan
from ops.terminal import console as make_console
from ops.terminal import from_caller, print_error

TRAINING_PYTHON = REPO_ROOT / ".venv" / "tf218" / "bin" / "python"
LOCATION_KEYS = ("trainData", "evalData", "checkpointDir", "exportDir", "tensorboardDir")
DEFAULT_STEPS = 40
DEFAULT_BATCH = 64
# A quarter of the width is a sixteenth of the weights: an MNIST CNN checkpoint of 307 MB
# becomes 20 MB, and the whole rehearsal stays well under 200 MB on disk.
REHEARSAL_WIDTH = 0.25
REHEARSAL_IMAGE_SIZE = 32  # ResNets: the smallest size the job accepts (config.py)
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
    train = min(job["trainSteps"], DEFAULT_STEPS if steps is None else steps)
    per_execution = min(job.get("stepsPerExecution", 100), max(1, train // EXECUTIONS))
    local |= {"trainSteps": train // per_execution * per_execution,
              "stepsPerExecution": per_execution,
              "checkpointEverySteps": per_execution,
              "globalBatchSize": min(job["globalBatchSize"],
                                     DEFAULT_BATCH if batch is None else batch),
              "widthMultiplier": min(job.get("widthMultiplier") or 1.0, REHEARSAL_WIDTH)}
    if job["model"] != "mnist_cnn":
        local["imageSize"] = min(job.get("imageSize") or 224, REHEARSAL_IMAGE_SIZE)
    changed = {key: (str(job.get(key)), str(local[key])) for key in local
               if local[key] != job.get(key)}
    return local, changed


def write_datasets(job: dict[str, Any], console: Console) -> None:
    """Synthetic records where the job's trainData (and evalData) patterns will find them."""
    for key in ("trainData", "evalData"):
        if job.get(key):
            write_dataset(key, job, console)


def write_dataset(key: str, job: dict[str, Any], console: Console) -> None:
    pattern = job[key]
    out = Path(pattern).parent
    # synth names files <prefix>-00000-of-00002.tfrecord: the prefix is the pattern's
    # file name up to its first wildcard (train-*.tfrecord -> train).
    prefix = Path(pattern).name.split("*", 1)[0].rstrip("-_.") or "train"
    examples = max(512, 2 * job["globalBatchSize"])
    console.print(f"synthetic data: {examples} {job['model']} examples into {out} ({key})",
                  markup=False)
    command = [str(TRAINING_PYTHON), "-m", "tpu_training", "synth", "--model", job["model"],
               "--out", str(out), "--examples", str(examples), "--shards", "2",
               "--prefix", prefix]
    for option, flag in (("recordFormat", "--format"), ("imageSize", "--image-size"),
                         ("numClasses", "--num-classes")):
        if job.get(option):
            command += [flag, str(job[option])]
    if not TRAINING_PYTHON.exists():
        raise RehearsalError(f"{TRAINING_PYTHON} is missing: build it with "
                             "`scripts/setup.sh tf218` (scripts/run.sh does)")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RehearsalError(f"tpu_training synth failed: {result.stderr.strip()[-400:]}")
    if not glob.glob(pattern):
        raise RehearsalError(f"{key} {pattern!r} matches none of the synthetic files in "
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
    except (SettingsError, StackFileError, PlanError, RehearsalError) as error:
        print_error(error)
        return 2
    workdir = workdir or REPO_ROOT / ".cache" / "rehearse" / stack
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    job, changed = rehearsal_job(json.loads(metadata[JOB_KEY]), workdir / "gcs", steps,
                                 batch)
    console.print(f"rehearsing {name} of stack {stack} in {workdir}", markup=False)
    console.print("The node gets the metadata the stack declares, except what this machine "
                  "cannot do as the VM does: TensorFlow's gs:// filesystem cannot reach a GCS "
                  "emulator, so the job's gs:// locations are local folders here, and the run "
                  "is CPU-sized. Changed in the job's config:", markup=False)
    for key, (before, after) in changed.items():
        console.print(f"  {key}: {before} -> {after}", markup=False)
    try:
        write_datasets(job, console)
        with StorageEmulator() as gcs:
            serve_package(gcs, metadata)
            code = boot(gcs, metadata | {JOB_KEY: json.dumps(job, sort_keys=True)}, job,
                        changed, workdir, console)
    except (RehearsalError, PackageError) as error:  # PackageError: the wheels cannot be fetched
        print_error(error)
        return 2
    console.print(f"the rehearsal left {disk_usage(workdir) / 1e6:.0f} MB in {workdir}",
                  markup=False)
    return code


def disk_usage(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def last_error_line(job_log: Path) -> str | None:
    """The job's own error line (`tpu_training: error: ...`), else its last line."""
    if not job_log.is_file():
        return None
    lines = [line.strip() for line in job_log.read_text(errors="replace").splitlines()
             if line.strip()]
    errors = [line for line in lines if line.startswith("tpu_training: error:")]
    return (errors or lines or [None])[-1]


def boot(gcs: StorageEmulator, metadata: dict[str, str], job: dict[str, Any],
         changed: dict[str, tuple[str, str]], workdir: Path, console: Console) -> int:
    # The release pointer (contract C1): the job and package reach the node as a release
    # object under its prefix, uploaded here as the stack uploads it.
    release = metadata.get(RELEASE_KEY) or (f"gs://{split(metadata[PACKAGE_KEY])[0]}/releases/"
                                            f"{metadata.get(NODE_KEY) or 'node'}/")
    publish_release(gcs, release, metadata[PACKAGE_KEY], metadata[PACKAGE_SHA256_KEY], job)
    attributes = metadata | {"agent-worker-number": "0", RELEASE_KEY: release}
    with MetadataServer(attributes, instance_name="rehearsal") as server, \
            (workdir / "bootstrap.log").open("w") as output:
        node = LocalNode(server, workdir / "node", gcs.host)
        console.print(f"booting: package {metadata[PACKAGE_KEY]} from the emulator, "
                      f"python {node.env['TPU_STACK_PYTHON']} (TPU_STACK_STRATEGY=cpu)",
                      markup=False)
        process = node.start(stdout=output, stderr=subprocess.STDOUT)
        try:
            code = follow(process, node, job["trainSteps"], console)
        except KeyboardInterrupt:
            process.terminate()  # the agent stops the job with a checkpoint
            code = process.wait()
        status_dir = keep_status(gcs, metadata[STATUS_KEY], workdir)
        for line in landed(node, job, changed, status_dir, metadata[STATUS_KEY], workdir):
            console.print(line, overflow="fold", highlight=False, markup=False)
    state = node.guest.get("state", "?")
    if code == 0:
        console.print(f"bootstrap exited with 0 (state {state})", markup=False)
        return code
    message = node.guest.get("message", "")
    print_error(f"the rehearsal failed: bootstrap exited with {code} (state {state}"
                f"{': ' + message if message else ''})")
    job_error = last_error_line(status_dir / "worker-0" / "job.log")
    if job_error:
        print(f"  the job's last line: {job_error}", file=sys.stderr)
    return code


def register(app: typer.Typer) -> None:
    @app.command("rehearse")
    def rehearse_command(
        stack: str = typer.Option("dev", "--stack", "-s", help="Stack name (Pulumi.<stack>.yaml)."),
        node: str | None = typer.Option(None, "--node", help="Logical node name (default: first)."),
        workdir: Path | None = typer.Option(
            None, "--workdir", help="Where everything lands (default .cache/rehearse/<stack>)."),
        steps: int | None = typer.Option(
            None, "--steps", min=1, help=f"Train this many steps (default {DEFAULT_STEPS})."),
        batch: int | None = typer.Option(
            None, "--batch", min=1, help=f"Global batch size on CPU (default {DEFAULT_BATCH})."),
    ) -> None:
        """Boot the stack's TPU node on this machine: emulated GCS and metadata, real job on CPU."""
        raise typer.Exit(rehearse(stack, workdir=from_caller(workdir), console=make_console(),
                                  node=node, steps=steps, batch=batch))
