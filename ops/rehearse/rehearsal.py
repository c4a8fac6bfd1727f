"""The rehearsal behind `tpuctl rehearse` (the verb: ops/commands/rehearse.py): boot a
stack's TPU node on this machine, offline, end to end.

The node's metadata comes from the stack's offline plan (the exact values the
TpuNode declares), the package is the archive the stack would upload, served by
a GCS emulator; a loopback metadata server answers the bootstrap, which installs
the package and runs the real job on CPU over a synthetic dataset.

Two honest differences from the VM, both printed: TensorFlow's gs:// filesystem
cannot be pointed at an emulator, so the job's gs:// locations become local
folders; and the job is CPU-sized: a few executions instead of the stack's
trainSteps, a small batch, a narrow model (its checkpoints stay small) and,
for ResNets, small images.

A pod slice boots every worker, each with its own metadata server (its own view:
`agent-worker-number`, `worker-network-endpoints`; a notice goes to all at once).
Worker 0 runs the job; on a pod its TensorFlow client drives every worker's TPU,
but TensorFlow refuses MirroredStrategy over remote CPU devices in eager mode
("In-graph multi-worker training with MirroredStrategy is not supported"), so
here worker 0 trains on its own CPU and the other workers are `idle`, serving
worker 0 as their agent does on a pod, each as the service the bootstrap installs.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from components.stack_config import StackFileError
from model.archive import (
    DEFAULT_WHEEL_CACHE,
    REPO_ROOT,
    TRAINING_DIR,
    PackageError,
    build_archive,
    ensure_wheels,
    read_lock,
)
from model.catalog import CatalogError
from model.pulumi_types import STORAGE_BUCKET_OBJECT
from model.settings.schema import SettingsError
from node_agent.contract import RELEASE_KEY, STARTUP_SCRIPT_KEY, STATUS_KEY
from ops.local.local_node import IMAGE_PYTHON, WORKER_NUMBER_KEY, LocalNode, publish_release
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator, split
from ops.plan.offline import Plan, PlanError, offline_plan
from ops.terminal import print_error
from ops.tpu import rehearsal_record
from ops.tpu.status_views import goodput_percent
from policy.tpu_policies import tpu_slice, tpu_view
from tpu_training.config import BERT_DEFAULTS, BERT_MODELS

# The synthetic data is written by the node image's Python (TensorFlow only), with the
# package's own source and the tf-keras wheel the package carries: no training venv.
SYNTH_PYTHON = IMAGE_PYTHON
NETWORK_ENDPOINTS_KEY = "worker-network-endpoints"
LOCATION_KEYS = ("trainData", "evalData", "checkpointDir", "exportDir", "tensorboardDir")
DEFAULT_STEPS = 40
DEFAULT_BATCH = 64
# A quarter of the width is a sixteenth of the weights: an MNIST CNN checkpoint of 307 MB
# becomes 20 MB, and the whole rehearsal stays well under 200 MB on disk.
REHEARSAL_WIDTH = 0.25
REHEARSAL_IMAGE_SIZE = 32  # ResNets: the smallest size the job accepts (config.py)
# BERT has no width knob: a rehearsal trains the smallest published BERT (4.4 M weights,
# 53 MB of checkpoint at BERT's vocabulary) on short synthetic sequences over a small
# vocabulary (synth's floor is 128 words: BERT's special tokens are ids 0 to 103).
REHEARSAL_BERT = "bert_tiny"
REHEARSAL_BERT_SHAPE = {"maxSeqLength": 32, "maxPredictionsPerSeq": 5, "vocabSize": 512}
EXECUTIONS = 4  # status updates during a rehearsal: one per execution
POLL_SECONDS = 0.5
T = TypeVar("T")


class RehearsalError(RuntimeError):
    """The rehearsal cannot start; the text says why and what to change."""


def planned_nodes(plan: Plan) -> dict[str, dict[str, str]]:
    """Each TPU node's metadata by its TpuNode's name (`node-trainer`): whatever
    resource carries a startup-script (a V2Vm, or a QueuedTpu's node)."""
    return {name: metadata for name, (metadata, _) in planned_slices(plan).items()}


def planned_slices(plan: Plan) -> dict[str, tuple[dict[str, str], int]]:
    """Each TPU node's metadata and its number of workers (hosts), by TpuNode name."""
    nodes = {}
    for resource in plan.run.registrations:
        metadata = resource.inputs.get("metadata")
        if isinstance(metadata, dict) and STARTUP_SCRIPT_KEY in metadata:
            component = plan.component_of(resource) or resource.name
            view = tpu_view(resource.type, resource.inputs) or resource.inputs
            nodes[component.split(":")[-1]] = (dict(metadata), tpu_slice(view).hosts)
    return nodes


def pick_nodes(nodes: Mapping[str, T], node: str | None) -> list[tuple[str, T]]:
    """Every node of the stack by name, or the one `node` names."""
    if node is None and nodes:
        return sorted(nodes.items())
    return [pick_node(nodes, node)]


def pick_node(nodes: Mapping[str, T], node: str | None) -> tuple[str, T]:
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
                  batch: int | None = None, data: Path | None = None,
                  ) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """The job with local locations and a CPU-sized run; what changed (key -> (from, to)).

    A TPU-sized job (a 1024 batch for thousands of steps) takes hours on a CPU;
    the rehearsal checks the boot, so it trains a few executions of a small batch.
    With `data` (a folder of the user's own records) the data keys point into it and the
    record's shape (BERT's sequence, predictions and vocabulary; a raw image's size) stays
    the job's, since the records have it.
    """
    local = dict(job)
    for key in LOCATION_KEYS:
        if job.get(key):
            local[key] = local_path(job[key], gcs_root)
    if data is not None:
        local |= {key: str(data / Path(job[key]).name) for key in DATA_KEYS if job.get(key)}
    train = min(job["trainSteps"], DEFAULT_STEPS if steps is None else steps)
    per_execution = min(job.get("stepsPerExecution", 100), max(1, train // EXECUTIONS))
    local |= {"trainSteps": train // per_execution * per_execution,
              "stepsPerExecution": per_execution,
              "checkpointEverySteps": per_execution,
              "globalBatchSize": min(job["globalBatchSize"],
                                     DEFAULT_BATCH if batch is None else batch)}
    if job.get("warmupSteps"):  # the same share of the run warms up (at most all of it)
        local["warmupSteps"] = job["warmupSteps"] * local["trainSteps"] // job["trainSteps"]
    local |= cpu_sized_model(job, own_records=data is not None)
    changed = {key: (str(job.get(key)), str(local[key])) for key in local
               if local[key] != job.get(key)}
    return local, changed


def cpu_sized_model(job: dict[str, Any], *, own_records: bool) -> dict[str, Any]:
    """The model settings a CPU trains in seconds: a narrow image model on small images,
    or the smallest BERT on short sequences (a shape the user's own records keep)."""
    if job["model"] in BERT_MODELS:
        shape = {} if own_records else {key: min(job.get(key) or BERT_DEFAULTS[key], value)
                                        for key, value in REHEARSAL_BERT_SHAPE.items()}
        return {"model": REHEARSAL_BERT, **shape}
    sized: dict[str, Any] = {
        "widthMultiplier": min(job.get("widthMultiplier") or 1.0, REHEARSAL_WIDTH)}
    raw_images = job.get("recordFormat", "raw") == "raw"
    if job["model"] != "mnist_cnn" and not (own_records and raw_images):
        sized["imageSize"] = min(job.get("imageSize") or 224, REHEARSAL_IMAGE_SIZE)
    return sized


DATA_KEYS = ("trainData", "evalData")


def own_records(job: dict[str, Any], data: Path) -> None:
    """The user's records under `data` for each of the job's data patterns, or why not."""
    if not data.is_dir():
        raise RehearsalError(f"--data {data}: not a folder")
    for key in DATA_KEYS:
        if job.get(key) and not glob.glob(job[key]):
            raise RehearsalError(f"--data {data}: no file matches {Path(job[key]).name} (the "
                                 f"file pattern of the stack's {key}); put the records there "
                                 f"or leave out --data for synthetic ones")


def write_datasets(job: dict[str, Any], console: Console) -> None:
    """Synthetic records where the job's trainData (and evalData) patterns will find them,
    written by one process (TensorFlow starts once)."""
    write_dataset([key for key in DATA_KEYS if job.get(key)], job, console, synth_env())


IMAGE_TF_VERSION = ("import importlib.metadata as m\n"
                    "for name in ('tensorflow', 'tensorflow-cpu', 'tensorflow-tpu'):\n"
                    "    try:\n        print(m.version(name)); break\n"
                    "    except m.PackageNotFoundError:\n        pass\n")


def synth_env() -> dict[str, str]:
    """The environment `tpu_training synth` runs in with the image's Python: the package's
    source and the pinned tf-keras wheel for the image's TensorFlow on PYTHONPATH (a
    pure-Python wheel imports from its zip, as the agent's installed copy would)."""
    if not SYNTH_PYTHON.exists():
        raise RehearsalError(f"{SYNTH_PYTHON} is missing: build it with "
                             "`scripts/setup.sh image` (scripts/run.sh does)")
    found = subprocess.run([str(SYNTH_PYTHON), "-c", IMAGE_TF_VERSION], capture_output=True,
                           text=True, check=False).stdout.split()
    minor = ".".join(found[0].split(".")[:2]) if found else "?"
    pins = [pin for pin in read_lock()
            if pin.requirement.split("==")[1].startswith(f"{minor}.")]
    if not pins:
        raise RehearsalError(f"{SYNTH_PYTHON} has TensorFlow {minor}, and training/wheels.lock "
                             "pins no tf-keras for it")
    cache = Path(os.environ.get("TPU_STACK_WHEEL_CACHE", DEFAULT_WHEEL_CACHE))
    (wheel,) = ensure_wheels(pins[:1], cache)
    paths = [str(TRAINING_DIR), str(wheel), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in paths if p),
                         "CUDA_VISIBLE_DEVICES": ""}


# Runs several `tpu_training synth` command lines in one process (argv: their JSON).
# Stops at the first that fails: one error, printed once.
SYNTH_EACH = ("import json, sys\nfrom tpu_training.__main__ import main\n"
              "for args in json.loads(sys.argv[1]):\n"
              "    if code := main(args):\n        sys.exit(code)\n")


def synth_args(key: str, job: dict[str, Any]) -> list[str]:
    """`tpu_training synth` arguments for the files `job[key]` will match. Eval data
    takes the train data's seed: a class's prototype comes from the seed (synth.py), so
    another seed would be another task; the records are the same, the rehearsal checks
    that evaluation runs."""
    pattern = job[key]
    # synth names files <prefix>-00000-of-00002.tfrecord: the prefix is the pattern's
    # file name up to its first wildcard (train-*.tfrecord -> train).
    prefix = Path(pattern).name.split("*", 1)[0].rstrip("-_.") or "train"
    args = ["synth", "--model", job["model"], "--out", str(Path(pattern).parent),
            "--examples", str(synth_examples(job)), "--shards", "2", "--prefix", prefix]
    for option, flag in (("recordFormat", "--format"), ("imageSize", "--image-size"),
                         ("numClasses", "--num-classes"), ("maxSeqLength", "--max-seq-length"),
                         ("maxPredictionsPerSeq", "--max-predictions-per-seq"),
                         ("vocabSize", "--vocab-size")):
        if job.get(option):
            args += [flag, str(job[option])]
    return args


def synth_examples(job: dict[str, Any]) -> int:
    return max(512, 2 * job["globalBatchSize"])


def write_dataset(keys: str | list[str], job: dict[str, Any], console: Console,
                  env: dict[str, str] | None = None) -> None:
    """Synthetic records for each of `keys` (trainData, evalData), in one process."""
    keys = [keys] if isinstance(keys, str) else keys
    for key in keys:
        console.print(f"synthetic data: {synth_examples(job)} {job['model']} examples into "
                      f"{Path(job[key]).parent} ({key})", markup=False)
    command = [str(SYNTH_PYTHON), "-c", SYNTH_EACH,
               json.dumps([synth_args(key, job) for key in keys])]
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise RehearsalError(f"tpu_training synth failed: {result.stderr.strip()[-400:]}")
    for key in keys:
        out = Path(job[key]).parent
        if not glob.glob(job[key]):
            raise RehearsalError(f"{key} {job[key]!r} matches none of the synthetic files in "
                                 f"{out} ({', '.join(sorted(p.name for p in out.iterdir()))})")


def planned_release(plan: Plan, metadata: dict[str, str]) -> dict[str, Any]:
    """The release the stack uploads for this node (contract C1): the BucketObject
    under the node's `tpu-stack-release` prefix, its content `{job, package, sha256}`."""
    return planned_release_object(plan, metadata)[1]


def planned_release_object(plan: Plan, metadata: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """The node's release object as the plan uploads it: its gs:// URI and content."""
    bucket, prefix = split(metadata[RELEASE_KEY])
    for resource in plan.run.registrations:
        inputs = resource.inputs
        if (resource.type == STORAGE_BUCKET_OBJECT
                and inputs.get("bucket") == bucket
                and str(inputs.get("name", "")).startswith(prefix)):
            return f"gs://{bucket}/{inputs['name']}", json.loads(inputs["content"])
    raise RehearsalError(f"the plan has no release object under {metadata[RELEASE_KEY]}")


def serve_package(gcs: StorageEmulator, metadata: dict[str, str],
                  release: dict[str, Any]) -> None:
    """The archive the stack would upload, at the URI the node's release names."""
    archive = build_archive()
    if archive.sha256 != release["sha256"]:
        raise RehearsalError("training/ changed while planning; run the rehearsal again")
    uris = (release["package"], metadata[RELEASE_KEY], metadata[STATUS_KEY])
    for bucket in sorted({split(uri)[0] for uri in uris}):
        gcs.create_bucket(bucket)
    gcs.upload(release["package"], archive.data)


def worker_endpoints(hosts: int) -> str:
    """`worker-network-endpoints` as the TPU runtime gives every worker of a pod: one
    `<a>:<b>:<ip>` per worker, worker 0 first (docs/tpu-facts.md). Here each worker is
    this machine at a loopback address of its own (all of 127.0.0.0/8 is loopback); the
    first two fields are not read by anyone (values unconfirmed)."""
    return ",".join(f"unknown:unknown:127.0.0.{worker + 1}" for worker in range(hosts))


def worker_view(metadata: dict[str, str], worker: int, hosts: int) -> dict[str, str]:
    """What worker `worker`'s metadata server answers: the node's metadata, plus what the
    TPU runtime adds per worker."""
    view = metadata | {WORKER_NUMBER_KEY: str(worker)}
    if hosts > 1:
        view[NETWORK_ENDPOINTS_KEY] = worker_endpoints(hosts)
    return view


# systemctl for a rehearsed worker other than 0 (and the agent tests): `enable --now
# UNIT` or `start UNIT` runs the unit's ExecStart (the agent as a service, `run
# --stay`) in the foreground, as systemd would, its pid kept as the unit's MAINPID
# (exec keeps the pid); `is-active` asks whether that pid lives; `reload` runs the
# unit's ExecReload with $MAINPID, as systemd.service(5) describes.
SYSTEMCTL = r"""#!/usr/bin/env bash
unit_file=$TPU_STACK_UNIT_DIR/${!#}
main_pid=$unit_file.mainpid
active() { [[ -f $main_pid ]] && kill -0 "$(cat "$main_pid")" 2>/dev/null; }
case $1 in
  is-active) active ;;
  enable|start)
    if [[ $1 == enable && $2 != --now ]] || active; then exit 0; fi
    echo $$ > "$main_pid"
    read -ra command < <(sed -n 's/^ExecStart=//p' "$unit_file")
    exec "${command[@]}" ;;
  reload)
    active || exit 1
    read -ra command < <(sed -n 's/^ExecReload=//p' "$unit_file")
    "${command[@]//\$MAINPID/$(cat "$main_pid")}" ;;
  *) exit 0 ;;
esac
"""


@dataclass
class Worker:
    number: int
    node: LocalNode
    process: subprocess.Popen[str] | None = None

    @property
    def guest(self) -> dict[str, str]:
        return self.node.guest

    def stop(self, sig: int = signal.SIGTERM, *, group: bool = False) -> None:
        """Signal the worker's agent: worker 0's bootstrap execs it; a service worker's is
        a child of its bootstrap, so it takes the whole process group (`group`)."""
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if group or self.number > 0:
                    os.killpg(self.process.pid, sig)
                else:
                    self.process.send_signal(sig)


class Pod:
    """Every worker of a node on this machine: a metadata server each (its own view of
    the node's metadata), one storage emulator. Worker 0's bootstrap runs in the
    foreground with the job; the others' run their agent as the service a VM's
    bootstrap installs (a stand-in systemctl), so they follow updates and notices."""

    def __init__(self, metadata: dict[str, str], hosts: int, workdir: Path,
                 storage_host: str):
        self.metadata, self.hosts, self.workdir = metadata, hosts, workdir
        self.storage_host = storage_host
        self.workers: list[Worker] = []
        self._servers = contextlib.ExitStack()

    def __enter__(self) -> Pod:
        bin_dir = self.workdir / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        (bin_dir / "systemctl").write_text(SYSTEMCTL)
        (bin_dir / "systemctl").chmod(0o755)
        for number in range(self.hosts):
            server = self._servers.enter_context(MetadataServer(
                worker_view(self.metadata, number, self.hosts),
                instance_name=f"rehearsal-w-{number}"))
            root = self.workdir / ("node" if number == 0 else f"node-worker-{number}")
            service = {} if number == 0 else {
                "TPU_STACK_INIT": "systemd", "TPU_STACK_UNIT_DIR": str(root),
                "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
            self.workers.append(Worker(number, LocalNode(server, root, self.storage_host,
                                                         service)))
        return self

    def __exit__(self, *_: object) -> None:
        for worker in self.workers:
            worker.stop(signal.SIGKILL, group=True)
            if worker.process:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.process.wait(10)
        self._servers.close()

    def start(self, log_dir: Path) -> None:
        for worker in self.workers:
            log = (log_dir / f"bootstrap{'' if worker.number == 0 else f'-worker-{worker.number}'}"
                   ".log").open("w")
            worker.process = worker.node.start(stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
            log.close()

    def preempt(self) -> None:
        """The notice Compute Engine gives every VM of the slice at once."""
        for worker in self.workers:
            worker.node.metadata.preempt()

    def finish(self, timeout: float = 60) -> dict[int, int | None]:
        """Each worker's exit code once worker 0's bootstrap is done (None: still running
        after `timeout`). A service agent exits only when stopped: one still running is
        stopped here (SIGTERM, as systemd stops it) and counts as 0; one that exited
        earlier keeps its code."""
        codes: dict[int, int | None] = {}
        for worker in self.workers:
            assert worker.process is not None
            early = worker.process.poll()
            if worker.number > 0 and early is None:
                worker.stop()
            try:
                code = worker.process.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
            codes[worker.number] = 0 if worker.number > 0 and early is None else code
        return codes


def follow(pod: Pod, total: int, console: Console) -> int:
    """A progress bar of worker 0's guest attributes until its bootstrap exits."""
    lead = pod.workers[0]
    assert lead.process is not None
    columns = (TextColumn("[bold]{task.description:<12}"), BarColumn(),
               TextColumn("step {task.completed:.0f}/{task.total:.0f}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("booting", total=total)
        while lead.process.poll() is None:
            guest = lead.guest
            progress.update(task, description=guest.get("state", "booting"),
                            completed=int(guest.get("step", 0)))
            time.sleep(POLL_SECONDS)
        guest = lead.guest
        progress.update(task, description=guest.get("state", "?"),
                        completed=int(guest.get("step", 0)))
    return lead.process.returncode


def keep_status(gcs: StorageEmulator, prefix: str, workdir: Path) -> Path:
    """Copy the status objects out of the (in-memory) emulator before it stops."""
    out = workdir / "status-objects"
    for uri in gcs.names(prefix):
        target = out / uri.removeprefix(prefix)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gcs.read(uri) or b"")
    return out


def landed(job: dict[str, Any], changed: dict[str, tuple[str, str]], status_dir: Path,
           status_prefix: str, workdir: Path) -> list[str]:
    """Where each output went: the VM's location, then this machine's."""
    lines = []
    for key in ("checkpointDir", "exportDir", "tensorboardDir"):
        if key in changed:
            folder = Path(job[key])
            entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
            lines.append(f"{key}: {changed[key][0]}\n  here: {folder} [{shown or 'empty'}]")
    lines.append(f"status and job log: {status_prefix}worker-<n>/\n  here: {status_dir}/"
                 f"worker-<n>/ (status.json, job.log)")
    lines.append(f"node disk (/opt/tpu-stack on the VM): {workdir / 'node'}")
    lines.append(f"bootstrap output (the startup-script journal on the VM): "
                 f"{workdir / 'bootstrap.log'}")
    return lines


STOPPED = (75, 76)  # stopped on SIGTERM, with or without a save (bootstrap.sh, the unit)
STEP_LOSS = re.compile(r"^tpu_training step=(\d+) loss=(\S+)", re.M)  # docs/design.md,
EVAL_LINE = re.compile(r"^tpu_training (eval_accuracy=\S+ eval_loss=\S+)", re.M)  # job lines


def job_log_text(status_dir: Path, worker: int) -> str:
    path = status_dir / f"worker-{worker}" / "job.log"
    return path.read_text(errors="replace") if path.is_file() else ""


def checkpoint_steps(job: dict[str, Any]) -> list[int]:
    folder = Path(job.get("checkpointDir") or "")
    return sorted(int(p.name[5:-6]) for p in folder.glob("ckpt-*.index")
                  if p.name[5:-6].isdigit())


def status_table(pod: Pod, job: dict[str, Any], status_dir: Path,
                 codes: dict[int, int | None]) -> Table:
    """What `tpuctl status` would show for the node, one row per worker, plus the loss
    and the checkpoints the job left."""
    table = Table(title="what `tpuctl status` would show", title_justify="left",
                  box=None, pad_edge=False)
    for column in ("worker", "state", "step", "last loss", "goodput", "checkpoints",
                   "message"):
        table.add_column(column)
    saved = ", ".join(map(str, checkpoint_steps(job))) or "none"
    for worker in pod.workers:
        guest = worker.guest
        losses = STEP_LOSS.findall(job_log_text(status_dir, worker.number))
        state, message = guest.get("state", "?"), guest.get("message", "")
        if codes.get(worker.number) not in (0, None, *STOPPED) and state != "failed":
            state, message = "failed", f"the agent exited with {codes[worker.number]}"
        table.add_row(str(worker.number), state, guest.get("step", ""),
                      losses[-1][1] if losses else "", goodput_percent(guest),
                      saved if worker.number == 0 else "", message)
    return table


def about_the_run(pod: Pod, job: dict[str, Any], status_dir: Path) -> list[str]:
    """Which workers ran what, and what a short run's numbers mean."""
    if pod.hosts > 1:
        others = "worker 1 is" if pod.hosts == 2 else f"workers 1-{pod.hosts - 1} are"
        lines = [f"workers rehearsed: all {pod.hosts} (0-{pod.hosts - 1}), each with its own "
                 "metadata server. Worker 0 ran the job on CPU; on the pod its TensorFlow "
                 "client drives every worker's TPU, but TensorFlow refuses MirroredStrategy "
                 f"over remote CPU devices in eager mode, so {others} idle here, serving "
                 "worker 0 as their agents do on the pod."]
    else:
        lines = ["workers rehearsed: 0, the node's only worker (single host)."]
    evaluation = EVAL_LINE.findall(job_log_text(status_dir, 0))
    if evaluation:
        classes = job.get("numClasses") or 10
        lines.append(f"evaluation after {job['trainSteps']} steps: {evaluation[-1]}. It shows "
                     f"that evaluation runs, not how good a model is: the synthetic data is "
                     f"easy to learn, so any accuracy from chance (1/{classes} = "
                     f"{1 / classes:.3g}) to 1 is expected.")
    lines.append("goodput counts startup (TensorFlow import, model build) against a run of "
                 "seconds; on a node it is a small share of hours of training.")
    return lines


def rehearse(stack: str, *, workdir: Path | None, console: Console, node: str | None = None,
             steps: int | None = None, batch: int | None = None, data: Path | None = None,
             config: dict[str, str] | None = None) -> int:
    """Boot each of the stack's nodes here, one after another (or the one `node` names),
    each in a folder of its own under `workdir` (default .cache/rehearse/<stack>), kept
    until that node is rehearsed again. 0 when every node's rehearsal succeeded, else the
    first failed node's code (its worker 0's bootstrap exit code, 75 stopped, 2 could
    not start). `data`: a folder of the user's own records instead of synthetic ones;
    `config`: the stack's config instead of its files. A rehearsal that cannot start
    leaves why, for `tpuctl status --offline` (rehearsal_record.write_failure)."""
    root = workdir or REPO_ROOT / ".cache" / "rehearse" / stack
    rehearsal_record.clear_failure(root)
    try:
        plan = offline_plan(stack, config)
        chosen = pick_nodes(planned_slices(plan), node)
        releases = {name: planned_release_object(plan, metadata)
                    for name, (metadata, _) in chosen}
    except (SettingsError, StackFileError, PlanError, RehearsalError, CatalogError) as error:
        print_error(error)
        rehearsal_record.write_failure(root, str(error))
        return 2
    names = [name for name, _ in chosen]
    if len(chosen) > 1:
        console.print(f"stack {stack} has {len(chosen)} nodes: rehearsing each, one after "
                      f"another ({', '.join(names)}; --node NAME rehearses one)", markup=False)
    codes = {}
    for name, (metadata, hosts) in chosen:
        codes[name] = rehearse_node(stack, name, metadata, hosts, releases[name], root / name,
                                    console, steps, batch, data)
    if len(codes) > 1:
        console.print("rehearsed: " + ", ".join(
            f"{name} {'ok' if code == 0 else f'exit {code}'}" for name, code in codes.items()),
            markup=False)
    return next((code for code in codes.values() if code), 0)


def rehearse_node(stack: str, name: str, metadata: dict[str, str], hosts: int,
                  release_object: tuple[str, dict[str, Any]], workdir: Path, console: Console,
                  steps: int | None, batch: int | None, data: Path | None = None) -> int:
    """Boot one node (`name`, its TpuNode) in `workdir`; worker 0's bootstrap exit code
    (0 finished, 75 stopped), else the first failed worker's; 2 when it cannot start."""
    planned_uri, release = release_object
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    job, changed = rehearsal_job(release["job"], workdir / "gcs", steps, batch, data)
    console.print(f"rehearsing {name} of stack {stack} in {workdir}", markup=False)
    console.print("The node gets the metadata the stack declares, except what this machine "
                  "cannot do as the VM does: TensorFlow's gs:// filesystem cannot reach a GCS "
                  "emulator, so the job's gs:// locations are local folders here, and the run "
                  "is CPU-sized. Changed in the job's config:", markup=False)
    for key, (before, after) in changed.items():
        console.print(f"  {key}: {before} -> {after}", markup=False)
    if not release["job"].get("evalData"):
        console.print("  (no evalData in the stack's job: the job trains only, no evaluation)",
                      markup=False)
    try:
        if data is None:
            write_datasets(job, console)
        else:
            own_records(job, data)
        with StorageEmulator() as gcs:
            serve_package(gcs, metadata, release)
            # The job reaches the node as a release under its prefix, as the stack uploads it.
            rehearsed_uri = publish_release(gcs, metadata[RELEASE_KEY], release["package"],
                                            release["sha256"], job)
            for line in release_lines(planned_uri, rehearsed_uri, release["sha256"]):
                console.print(line, markup=False, overflow="fold")
            rehearsal_record.write_record(workdir, stack, name, planned_uri, rehearsed_uri)
            code = boot(gcs, metadata, hosts, job, changed, workdir, console)
    except (RehearsalError, PackageError) as error:  # PackageError: the wheels cannot be fetched
        print_error(error)
        rehearsal_record.write_failure(workdir.parent, f"{name}: {error}")
        return 2
    console.print(f"the rehearsal left {disk_usage(workdir) / 1e6:.0f} MB in {workdir}",
                  markup=False)
    return code


def release_lines(planned_uri: str, rehearsed_uri: str, package_sha256: str) -> list[str]:
    """The plan's release and the one the rehearsal publishes, and why they differ: a
    release's name is the digest of its content (contract C1), and the job in it is the
    CPU-sized one."""
    if planned_uri == rehearsed_uri:
        return [f"release: {planned_uri}, as the plan uploads it"]
    return [f"release: the plan uploads {planned_uri}",
            f"  rehearsed as {rehearsed_uri}: the same package ({package_sha256[:12]}...) with "
            "the job changed as above; a release is named by the digest of its content, so "
            "the name differs"]


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


def boot(gcs: StorageEmulator, metadata: dict[str, str], hosts: int, job: dict[str, Any],
         changed: dict[str, tuple[str, str]], workdir: Path, console: Console) -> int:
    with Pod(metadata, hosts, workdir, gcs.host) as pod:
        lead = pod.workers[0].node
        console.print(f"booting {hosts} worker{'s' if hosts > 1 else ''}: "
                      f"release {metadata[RELEASE_KEY]} from the emulator, python "
                      f"{lead.env['TPU_STACK_PYTHON']} (TPU_STACK_STRATEGY=cpu)", markup=False)
        pod.start(workdir)
        try:
            follow(pod, job["trainSteps"], console)
        except KeyboardInterrupt:
            pod.workers[0].stop()  # the agent stops the job with a checkpoint
        codes = pod.finish()
        status_dir = keep_status(gcs, metadata[STATUS_KEY], workdir)
        for line in landed(job, changed, status_dir, metadata[STATUS_KEY], workdir):
            console.print(line, overflow="fold", highlight=False, markup=False)
        console.print(status_table(pod, job, status_dir, codes))
        for line in about_the_run(pod, job, status_dir):
            console.print(line, highlight=False, markup=False)
        return outcome(pod, codes, status_dir, console)


def outcome(pod: Pod, codes: dict[int, int | None], status_dir: Path,
            console: Console) -> int:
    """Worker 0's exit code, else the first failed worker's; the failure is printed."""
    failed = [(w, codes[w.number]) for w in pod.workers
              if codes[w.number] != 0 or w.guest.get("state") == "failed"]
    if not failed:
        console.print(f"every worker's bootstrap exited with 0 (worker 0: "
                      f"{pod.workers[0].guest.get('state', '?')})", markup=False)
        return 0
    worker, code = failed[0]
    message = worker.guest.get("message", "")
    print_error(f"the rehearsal failed: worker {worker.number}'s bootstrap exited with "
                f"{code} (state {worker.guest.get('state', '?')}"
                f"{': ' + message if message else ''})")
    job_error = last_error_line(status_dir / f"worker-{worker.number}" / "job.log")
    if job_error:
        print(f"  the job's last line: {job_error}", file=sys.stderr)
    return code if code else 1
