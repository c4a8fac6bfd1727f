"""The job through N stop/resume cycles on CPU: goodput, steps lost per disruption, saves.

What is scaled, and how. The target case is one disruption per 30 minutes of training
with a checkpoint every 5 minutes: a disruption every 6 checkpoint intervals. The
drill keeps that ratio and scales time by `--scale` (default 60: a 5-minute interval
becomes 5 s, checkpointEveryMinutes = 5/60): each run trains `--intervals` (6)
checkpoint intervals of productive time, then gets SIGTERM (the agent's stop on a
preemption notice) or SIGKILL (no notice: every `--kill-every`-th disruption). A kill
lands at a uniformly random point of the last interval, so its loss is
representative; a SIGTERM lands where the kill would have.

Restart costs (starting Python, importing TensorFlow, building the model, tracing the
first execution) and the seconds of a save do not scale with time, so the drill's own
goodput understates the real one. It prints both:

- measured: productive seconds kept / wall seconds of every run, at the drill's scale,
  and the same for one undisrupted run of the same training time (the baseline);
- at full scale: the measured absolute restart and save seconds and the measured
  intervals lost per disruption, put into a 30-minute cycle with 5-minute intervals.

Save seconds are also measured for the full-size mnist_cnn and resnet50 (resnet50 at
imageSize 32: its checkpoint does not depend on the image size, global pooling sits
before the only dense layer), written to local disk: GCS is not reachable from here;
the preview estimates GCS time from the bytes (components/catalog.py).

Each run's stdout is read by the node agent's own parser of the job's lines
(node_agent/job_lines.py `JobRun`), and the agent's accounting (`settle_run`,
`Goodput`, what status.json's `goodput.percent` says) is applied to the same runs and
printed beside the drill's.

    PYTHONPATH=$PWD:$PWD/training .venv/tf218/bin/python bench/preemption_drill.py [--cycles 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from node_agent import goodput as agent  # Goodput, settle_run and (imported there) JobRun
from tpu_training import models, synth
from tpu_training.config import JobConfig

REAL_INTERVAL_SECONDS = 300.0  # a checkpoint every 5 minutes
TIMEOUT = 300.0
SMALL = {"model": "mnist_cnn", "widthMultiplier": 0.125, "globalBatchSize": 16,
         "stepsPerExecution": 5, "learningRate": 0.1}


@dataclasses.dataclass
class Run:
    """One process of the job, as the agent would see it from its stdout."""

    signal: int | None = None
    wall: float = 0.0
    code: int | None = None
    saves: list[dict] = dataclasses.field(default_factory=list)  # every `saved` line
    seen_by_agent: agent.JobRun = dataclasses.field(default_factory=agent.JobRun)

    def read(self, line: str) -> None:
        if self.seen_by_agent.read(line) == "save":
            self.saves.append(self.seen_by_agent.last_save)

    @property
    def resumed_from(self) -> int:
        return self.seen_by_agent.start_step

    @property
    def last_step(self) -> int:
        return self.seen_by_agent.step

    @property
    def goodput(self) -> dict[str, float]:
        """The job's last `goodput` line: its seconds per category so far."""
        return self.seen_by_agent.reported

    @property
    def restart_seconds(self) -> float:
        """Everything but training and saving: start-up, TPU init, restore, process exit."""
        return self.wall - self.goodput["productive"] - self.goodput["checkpoint_save"]


def launch(config: Path, until_productive: float | None, signum: int | None) -> Run:
    """Run the job; once it has trained `until_productive` seconds, send `signum`."""
    env = {**os.environ, "TPU_STACK_STRATEGY": "cpu", "TPU_STACK_CPU_REPLICAS": "1"}
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "tpu_training", "run", "--config",
                                str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put(None)],
                     daemon=True).start()
    run, sent = Run(signal=signum), False
    while (line := lines.get(timeout=TIMEOUT)) is not None:
        run.read(line.rstrip("\n"))
        trained = run.goodput.get("productive", 0.0)
        if not sent and until_productive is not None and trained >= until_productive:
            process.send_signal(signum)
            sent = True
    run.code = process.wait(timeout=TIMEOUT)
    run.wall = time.monotonic() - started
    return run


def write_config(root: Path, data: str, **job) -> Path:
    config = {"trainData": data, "trainSteps": 10**7, "checkpointEverySteps": 10**6,
              "checkpointDir": str(root / "ckpt"), "exportDir": str(root / "export"),
              "tensorboardDir": str(root / "tb"), **job}
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.json"
    path.write_text(json.dumps(config))
    return path


def dataset(root: Path, **job) -> str:
    shape = {key: job[key] for key in ("model", "imageSize", "numClasses") if key in job}
    spec = models.model_spec(JobConfig.from_dict(
        {"trainData": "x", "trainSteps": 1, "globalBatchSize": 1, "stepsPerExecution": 1,
         "checkpointEverySteps": 1, **shape}, resolved=False))
    return synth.write_dataset(str(root), spec, examples=512, shards=4).pattern


def drill(root: Path, args: argparse.Namespace) -> tuple[list[Run], Run]:
    interval = REAL_INTERVAL_SECONDS / args.scale
    period = args.intervals * interval
    data = dataset(root / "data", **SMALL)
    rng = random.Random(args.seed)
    config = write_config(root / "drill", data, checkpointEveryMinutes=interval / 60, **SMALL)
    runs = []
    for cycle in range(1, args.cycles + 1):
        kill = cycle % args.kill_every == 0
        at = period - rng.uniform(0, interval)
        runs.append(launch(config, at, signal.SIGKILL if kill else signal.SIGTERM))
    runs.append(launch(config, 0.0, signal.SIGTERM))  # the resume after the last disruption
    baseline = launch(write_config(root / "baseline", data,
                                   checkpointEveryMinutes=interval / 60, **SMALL),
                      args.cycles * period, signal.SIGTERM)
    return runs, baseline


def save_seconds(root: Path, model: str, **job) -> tuple[float, int]:
    """One save of a full-size `model` (local disk): its seconds and bytes."""
    shape = {"model": model, "globalBatchSize": 2, "stepsPerExecution": 1, **job}
    config = write_config(root / model, dataset(root / f"{model}-data", **shape),
                          trainSteps=1, checkpointEverySteps=1, **shape)
    first, *_ = launch(config, None, None).saves
    return first["seconds"], first["bytes"]


def goodput(runs: list[Run], lost_seconds: float) -> float:
    productive = sum(run.goodput["productive"] for run in runs)
    return (productive - lost_seconds) / sum(run.wall for run in runs)


def agent_percent(runs: list[Run]) -> float | None:
    """status.json's `goodput.percent` after these runs, as the node agent sums them."""
    totals = agent.Goodput("drill")
    for run in runs:
        totals.merge(agent.settle_run(run.seen_by_agent, run.code, run.wall))
    return totals.view()["percent"]


def report(runs: list[Run], baseline: Run, args: argparse.Namespace,
           saves: dict[str, tuple[float, int]]) -> None:
    interval = REAL_INTERVAL_SECONDS / args.scale
    print(f"scale 1/{args.scale:g}: checkpoint every {interval:g} s, a disruption every "
          f"{args.intervals} intervals ({args.intervals * interval:g} s of training)")
    print("| # | signal | exit | step reached | resumed at | steps lost | intervals lost "
          "| stop save s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    lost_seconds, lost_intervals = 0.0, {signal.SIGTERM: [], signal.SIGKILL: []}
    for number, (run, after) in enumerate(itertools.pairwise(runs), start=1):
        lost = run.last_step - after.resumed_from
        per_step = run.goodput["productive"] / max(1, run.last_step - run.resumed_from)
        steps_per_interval = interval / per_step
        lost_seconds += lost * per_step
        lost_intervals[run.signal].append(lost / steps_per_interval)
        stop = [f"{save['seconds']:.3f}" for save in run.saves if save["reason"] == "stop"]
        print(f"| {number} | {signal.Signals(run.signal).name} | {run.code} | {run.last_step} "
              f"| {after.resumed_from} | {lost} | {lost / steps_per_interval:.2f} "
              f"| {', '.join(stop) or '-'} |")
    measured, base = goodput(runs, lost_seconds), goodput([baseline], 0.0)
    print(f"goodput measured: {measured:.1%} (undisrupted baseline {base:.1%}; "
          f"ratio {measured / base:.3f})")
    print(f"goodput by the node agent's accounting: {agent_percent(runs)}% (baseline "
          f"{agent_percent([baseline])}%)")
    restart = statistics.mean(run.restart_seconds for run in runs)
    save = statistics.mean(save["seconds"] for run in runs for save in run.saves)
    kills = lost_intervals[signal.SIGKILL] or [0.0]
    terms = lost_intervals[signal.SIGTERM] or [0.0]
    cycle = args.intervals * REAL_INTERVAL_SECONDS

    def full_scale(kill_share: float) -> float:
        lost = (kill_share * statistics.mean(kills) + (1 - kill_share) * statistics.mean(terms))
        return (cycle - lost * REAL_INTERVAL_SECONDS) / (cycle + args.intervals * save + restart)

    print(f"goodput at full scale (30 min per disruption, 5 min intervals, restart "
          f"{restart:.1f} s and save {save:.3f} s as measured): every disruption a SIGTERM "
          f"{full_scale(0):.1%}; the drill's mix (1 in {args.kill_every} a SIGKILL) "
          f"{full_scale(1 / args.kill_every):.1%}; every one a SIGKILL {full_scale(1):.1%}")
    print(f"steps lost to SIGTERM: max {max(terms):.2f} intervals; to SIGKILL: max "
          f"{max(kills):.2f}, mean {statistics.mean(kills):.2f} intervals")
    for model, (seconds, size) in saves.items():
        print(f"save {model}: {seconds:.3f} s for {size / 2**20:.1f} MiB (local disk)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--scale", type=float, default=60.0)
    parser.add_argument("--intervals", type=int, default=6)
    parser.add_argument("--kill-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-full-models", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs, baseline = drill(root, args)
        saves = {} if args.no_full_models else {
            "mnist_cnn": save_seconds(root, "mnist_cnn"),
            "resnet50 (imageSize 32)": save_seconds(root, "resnet50", imageSize=32)}
        report(runs, baseline, args, saves)


if __name__ == "__main__":
    main()
