"""What a hang costs: training time lost per hang, against the deadlines plus one checkpoint
interval (issue 31: "a hang never costs more than the deadline plus one checkpoint
interval of work").

The real agent boots on loopback (GCS emulator, metadata server, the real package and the
real job, mnist_cnn at 1/8 width on CPU) with its deadlines shortened through its
environment (docs/design.md, "Deadlines") and a checkpoint every `--interval` seconds.
`--hangs` times, at a uniformly random point of a checkpoint interval after the run's
first save, the job is frozen (SIGSTOP: every thread stops, as in a collective waiting
for a dead worker; no stacks can be written then, the signal stays pending). The agent
finds the hang, stops the job (SIGTERM, SIGKILL after the stop deadline) and starts it
again from its last checkpoint.

Per hang, from the job's own lines (timed as the bench reads job.log, every 20 ms):

- cost: from the moment the job reached the step it resumes from (the newest checkpoint)
  to the kill: the work since that checkpoint plus the time hung;
- bound: the execution deadline in force (the agent's message says it) + the agent's
  one-second look + the wait for stacks + the stop deadline, plus one checkpoint interval.

The ratio cost / bound must stay under 1. The agent's own `lost_progress` (status.json)
is printed beside the measured sum.

    PYTHONPATH=$PWD .venv/infra/bin/python bench/hang_cost.py [--hangs 4] [--interval 6]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.archive import build_archive
from ops.local.local_node import LocalNode, node_attributes, publish_release
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator

REPO = Path(__file__).resolve().parents[1]
TRAINING_PYTHON = REPO / ".venv" / "tf218" / "bin" / "python"
BUCKET = "bench"
POLL_SECONDS = 0.02
TIMEOUT = 300.0
STEP = re.compile(r"^tpu_training step=(\d+) ")
RESUMED = re.compile(r"^tpu_training resumed_from=(\d+)")
SAVED = re.compile(r"^tpu_training saved step=(\d+) ")
HUNG = re.compile(r"no progress for (\d+)s in phase (\w+) \(deadline (\d+)s\)")
KILLED = "s; killing it"  # the agent's note as it sends SIGKILL (node_agent/job.py)
RESTARTED = "hung job stopped; starting it again"
POLL_EVERY = 1.0  # the agent looks for a passed deadline once a second


@dataclass
class Log:
    """job.log as the bench reads it: each line with the time it was read."""

    path: Path
    offset: int = 0
    lines: list[tuple[float, str]] = field(default_factory=list)
    partial: str = ""

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        self.offset += len(data)
        now = time.monotonic()
        text = self.partial + data.decode(errors="replace")
        *complete, self.partial = text.split("\n")
        self.lines += [(now, line) for line in complete]

    def wait_for(self, found, since: int, what: str) -> tuple[int, float, str]:
        """(index, time, line) of the first line at or after `since` that `found` accepts."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            self.poll()
            for index in range(since, len(self.lines)):
                at, line = self.lines[index]
                if found(line):
                    return index, at, line
            time.sleep(POLL_SECONDS)
        raise TimeoutError(what)


@dataclass
class Hang:
    cost: float  # the kill - when the job reached the step it resumes from
    hung: float  # the kill - the last line before the freeze
    unsaved: float  # the freeze - when the job reached that step
    deadline: float


def job_config(dataset: str, work: Path, interval: float) -> dict[str, object]:
    return {"model": "mnist_cnn", "widthMultiplier": 0.125, "learningRate": 0.1,
            "trainData": dataset, "globalBatchSize": 16, "trainSteps": 10_000_000,
            "stepsPerExecution": 5, "checkpointEverySteps": 5_000_000,
            "checkpointEveryMinutes": interval / 60, "checkpointDir": str(work / "ckpt"),
            "exportDir": str(work / "export"), "tensorboardDir": str(work / "tb")}


def freeze_and_measure(log: Log, root: Path, interval: float, since: int) -> tuple[Hang, int]:
    """Wait for the current run's first save, freeze the job at a random point of the next
    interval, follow the agent to the restarted run's resumed_from line."""
    index, _, _ = log.wait_for(lambda line: bool(SAVED.match(line)), since, "a save")
    until = time.monotonic() + random.uniform(0.0, interval)
    while time.monotonic() < until:  # reading on: every line keeps the time it came
        log.poll()
        time.sleep(POLL_SECONDS)
    pid = int((root / "run" / "job.pid").read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    log.poll()
    before = [(at, line) for at, line in log.lines[since:] if at <= frozen]
    last_line = max(at for at, line in before if line.startswith("tpu_training "))
    hung_at, _, note = log.wait_for(lambda line: bool(HUNG.search(line)), index, "the hang")
    kill_index, killed, _ = log.wait_for(lambda line: KILLED in line, hung_at, "the kill")
    restart_index, _, _ = log.wait_for(lambda line: RESTARTED in line, kill_index, "restart")
    resumed_index, _, resumed = log.wait_for(lambda line: bool(RESUMED.match(line)),
                                             restart_index, "the restarted run")
    step = int(RESUMED.match(resumed)[1])
    reached = min(at for at, line in before if (m := STEP.match(line)) and int(m[1]) >= step)
    deadline = float(HUNG.search(note)[3])
    return Hang(killed - reached, killed - last_line, frozen - reached, deadline), resumed_index


def run(hangs: int, interval: float, deadline: float, stop: float, stacks: float,
        work: Path) -> tuple[list[Hang], dict[str, object]]:
    archive = build_archive()
    data = work / "data"
    subprocess.run([str(TRAINING_PYTHON), "-m", "tpu_training", "synth", "--model", "mnist_cnn",
                    "--out", str(data), "--examples", "512", "--shards", "2"],
                   check=True, capture_output=True)
    results: list[Hang] = []
    with StorageEmulator() as gcs:
        gcs.create_bucket(BUCKET)
        uri = f"gs://{BUCKET}/packages/{archive.filename}"
        gcs.upload(uri, archive.data)
        releases, status = f"gs://{BUCKET}/releases/n/", f"gs://{BUCKET}/status/n/"
        publish_release(gcs, releases, uri, archive.sha256,
                        job_config(str(data / "*.tfrecord"), work / "job", interval))
        server = MetadataServer(node_attributes(releases, status))
        env = {"TPU_STACK_RELEASE_POLL_SECONDS": "5",
               "TPU_STACK_EXECUTION_DEADLINE_FLOOR_SECONDS": str(deadline),
               "TPU_STACK_STOP_DEADLINE_SECONDS": str(stop),
               "TPU_STACK_STACKS_WAIT_SECONDS": str(stacks)}
        node = LocalNode(server, work / "node", gcs.host, env_extra=env)
        log = Log(node.job_log_path())
        boot = node.start(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            since = 0
            for _ in range(hangs):
                hang, since = freeze_and_measure(log, node.root, interval, since)
                results.append(hang)
        finally:
            boot.send_signal(signal.SIGTERM)
            boot.wait(TIMEOUT)
            server.close()
        final = json.loads(gcs.read(f"{status}worker-0/status.json") or b"{}")
    return results, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hangs", type=int, default=4)
    parser.add_argument("--interval", type=float, default=6.0, help="checkpoint every, s")
    parser.add_argument("--deadline", type=float, default=5.0, help="execution floor, s")
    parser.add_argument("--stop", type=float, default=3.0, help="stop deadline, s")
    parser.add_argument("--stacks", type=float, default=1.0, help="wait for stacks, s")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        hangs, status = run(args.hangs, args.interval, args.deadline, args.stop, args.stacks,
                            Path(tmp))
    print(f"checkpoint interval {args.interval:g} s, stacks wait {args.stacks:g} s, stop "
          f"deadline {args.stop:g} s, the agent's look {POLL_EVERY:g} s; execution deadline "
          f"as the agent said it")
    print("| hang | deadline s | unsaved work s | hung s | cost s | bound s | cost / bound "
          "| cost / (deadline + interval) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for number, hang in enumerate(hangs, start=1):
        bound = hang.deadline + POLL_EVERY + args.stacks + args.stop + args.interval
        ratios.append(hang.cost / bound)
        print(f"| {number} | {hang.deadline:.0f} | {hang.unsaved:.1f} | {hang.hung:.1f} | "
              f"{hang.cost:.1f} | {bound:.1f} | {hang.cost / bound:.2f} | "
              f"{hang.cost / (hang.deadline + args.interval):.2f} |")
    goodput = status.get("goodput") or {}
    measured = sum(hang.cost for hang in hangs)
    print(f"worst cost / bound: {max(ratios):.2f} (must stay under 1)")
    print(f"agent's lost_progress {goodput.get('lost_progress', 0):.1f} s vs measured cost "
          f"{measured:.1f} s: {goodput.get('lost_progress', 0) / measured:.2f}x; "
          f"last hang in status: {status.get('hang')}")


if __name__ == "__main__":
    main()
