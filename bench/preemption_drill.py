"""The job through N stop/resume cycles on CPU: goodput, steps lost per disruption, saves.

What is scaled, and how. The target case is one disruption per 30 minutes of training
with a checkpoint every `--interval-minutes` (default: the job's default
checkpointEveryMinutes, 1 minute; saves asynchronous): a disruption every 30 checkpoint
intervals. The drill keeps that ratio and scales time by `--scale` (default 60: a
1-minute interval becomes 1 s): each run trains `--intervals` checkpoint intervals of
productive time, then gets SIGTERM (the agent's stop on a preemption notice) or SIGKILL
(no notice: every `--kill-every`-th disruption; `--kill-every 1` all of them, `0` none).
A kill lands at a uniformly random point of the last interval, so its loss is
representative; a SIGTERM lands where the kill would have.

Restart costs (starting Python, importing TensorFlow, building the model, tracing the
first execution) and the seconds of a save do not scale with time, so the drill's own
goodput understates the real one. It prints both:

- measured: productive seconds kept / wall seconds of every run, at the drill's scale,
  and the same for one undisrupted run of the same training time (the baseline);
- at full scale: the measured absolute restart seconds, the seconds training waited for
  each save (`blocked=`, the copy to host memory of an asynchronous save), and the
  measured intervals lost per disruption, put into a 30-minute cycle.

`--throughput-seconds S` also trains the full-size mnist_cnn (a 293 MiB checkpoint) for
S seconds twice, with the new checkpointing (asynchronous, every interval) and without
(today's: no time interval, no save in that time), and prints steps per second of each
and their ratio.

Save seconds are also measured for the full-size mnist_cnn and resnet50 (resnet50 at
imageSize 32: its checkpoint does not depend on the image size, global pooling sits
before the only dense layer), written to local disk: GCS is not reachable from here;
the preview estimates GCS time from the bytes (model/catalog.py).

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

from node_agent import goodput as agent  # Goodput, settle_run
from node_agent import job_lines
from tpu_training import models, synth
from tpu_training.config import DEFAULT_CHECKPOINT_EVERY_MINUTES, JobConfig

TIMEOUT = 300.0
CYCLE_SECONDS = 1800.0  # one disruption per 30 minutes of training
SMALL = {"model": "mnist_cnn", "widthMultiplier": 0.125, "globalBatchSize": 16,
         "stepsPerExecution": 5, "learningRate": 0.1}


@dataclasses.dataclass
class Run:
    """One process of the job, as the agent would see it from its stdout."""

    signal: int | None = None
    wall: float = 0.0
    code: int | None = None
    saves: list[dict] = dataclasses.field(default_factory=list)  # every `saved` line
    step_times: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    seen_by_agent: job_lines.JobRun = dataclasses.field(default_factory=job_lines.JobRun)

    def read(self, line: str) -> None:
        if self.seen_by_agent.read(line) == "save":
            blocked = job_lines.key_values(line).get("blocked")
            self.saves.append({**self.seen_by_agent.last_save,
                               "blocked": float(blocked) if blocked else None})
        if line.startswith("tpu_training step="):
            self.step_times.append((time.monotonic(), int(line.split("=")[1].split()[0])))

    @property
    def steps_per_second(self) -> float:
        """Steps over the time between the first and last step lines (past compilation)."""
        (start, first), (end, last) = self.step_times[0], self.step_times[-1]
        return (last - first) / (end - start)

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


def start_job(config: Path) -> tuple[subprocess.Popen, queue.Queue[str | None]]:
    """The job on the CPU in a process of its own, and a queue of its stdout lines
    (None at the end)."""
    env = {**os.environ, "TPU_STACK_STRATEGY": "cpu", "TPU_STACK_CPU_REPLICAS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "tpu_training", "run", "--config",
                                str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put(None)],
                     daemon=True).start()
    return process, lines


def launch(config: Path, until_productive: float | None, signum: int | None,
           until_seconds: float | None = None) -> Run:
    """Run the job; once it has trained `until_productive` seconds (or run
    `until_seconds` since its first step line), send `signum`."""
    started = time.monotonic()
    process, lines = start_job(config)
    run, sent = Run(signal=signum), False
    while (line := lines.get(timeout=TIMEOUT)) is not None:
        run.read(line.rstrip("\n"))
        trained = run.goodput.get("productive", 0.0)
        timed_out = (until_seconds is not None and run.step_times
                     and time.monotonic() - run.step_times[0][0] >= until_seconds)
        if not sent and ((until_productive is not None and trained >= until_productive)
                         or timed_out):
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
    interval = args.interval_minutes * 60 / args.scale
    period = args.intervals * interval
    data = dataset(root / "data", **SMALL)
    rng = random.Random(args.seed)
    # --auto: the job's own interval (checkpointEvery: auto) for a node disrupted once a period.
    auto = {"checkpointEvery": "auto", "mtbfSeconds": period} if args.auto else {}
    config = write_config(root / "drill", data, checkpointEveryMinutes=interval / 60, **auto,
                          **SMALL)
    runs = []
    for cycle in range(1, args.cycles + 1):
        kill = bool(args.kill_every) and cycle % args.kill_every == 0
        at = period - rng.uniform(0, interval)
        runs.append(launch(config, at, signal.SIGKILL if kill else signal.SIGTERM))
    runs.append(launch(config, 0.0, signal.SIGTERM))  # the resume after the last disruption
    baseline = launch(write_config(root / "baseline", data,
                                   checkpointEveryMinutes=interval / 60, **auto, **SMALL),
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


def throughput(root: Path, seconds: float, interval_minutes: float) -> list[tuple[Run, Run]]:
    """The full-size mnist_cnn for `seconds` a run, saving every interval (asynchronously)
    and without a time interval (today's default), in the order with, without, without,
    with, so that a drift of the machine's load cancels out."""
    shape = {"model": "mnist_cnn", "globalBatchSize": 16, "stepsPerExecution": 5}
    data = dataset(root / "throughput-data", **shape)
    runs: dict[str, list[Run]] = {"with": [], "without": []}
    for number, name in enumerate(("with", "without", "without", "with")):
        minutes = interval_minutes if name == "with" else 10**6
        config = write_config(root / f"throughput-{number}", data,
                              checkpointEveryMinutes=minutes, **shape)
        runs[name].append(launch(config, None, signal.SIGTERM, until_seconds=seconds))
    return list(zip(runs["with"], runs["without"], strict=True))


def report(runs: list[Run], baseline: Run, args: argparse.Namespace,
           saves: dict[str, tuple[float, int]]) -> None:
    real_interval = args.interval_minutes * 60
    interval = real_interval / args.scale
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
    interval_saves = [save for run in runs for save in run.saves if save["reason"] != "stop"]
    save = statistics.mean(save["blocked"] for save in interval_saves)
    written = statistics.mean(save["seconds"] for save in interval_saves)
    kills = lost_intervals[signal.SIGKILL] or [0.0]
    terms = lost_intervals[signal.SIGTERM] or [0.0]
    cycle = args.intervals * real_interval

    def full_scale(kill_share: float) -> float:
        lost = (kill_share * statistics.mean(kills) + (1 - kill_share) * statistics.mean(terms))
        return (cycle - lost * real_interval) / (cycle + args.intervals * save + restart)

    mix = 1 / args.kill_every if args.kill_every else 0.0
    print(f"goodput at full scale ({cycle / 60:g} min per disruption, {real_interval:g} s "
          f"intervals, restart {restart:.1f} s and training blocked {save:.3f} s a save (its "
          f"write {written:.3f} s) as measured): every disruption a SIGTERM "
          f"{full_scale(0):.1%}; this drill's mix ({mix:.0%} SIGKILL) {full_scale(mix):.1%}; "
          f"every one a SIGKILL {full_scale(1):.1%}")
    print(f"steps lost to SIGTERM: max {max(terms):.2f} intervals; to SIGKILL: max "
          f"{max(kills):.2f}, mean {statistics.mean(kills):.2f} intervals")
    for model, (seconds, size) in saves.items():
        print(f"save {model}: {seconds:.3f} s for {size / 2**20:.1f} MiB (local disk)")


def report_throughput(pairs: list[tuple[Run, Run]]) -> None:
    for with_saves, without in pairs:
        blocked = [save["blocked"] for save in with_saves.saves if save["reason"] != "stop"]
        print(f"full-size mnist_cnn steps/s: with asynchronous saves every interval "
              f"{with_saves.steps_per_second:.3f} ({len(blocked)} saves, training blocked "
              f"{sum(blocked):.2f} s in all), without {without.steps_per_second:.3f}; ratio "
              f"{with_saves.steps_per_second / without.steps_per_second:.3f}")
    with_all = sum(pair[0].steps_per_second for pair in pairs)
    without_all = sum(pair[1].steps_per_second for pair in pairs)
    print(f"steps/s ratio, with / without, over the {2 * len(pairs)} runs: "
          f"{with_all / without_all:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--scale", type=float, default=60.0)
    parser.add_argument("--interval-minutes", type=float,
                        default=DEFAULT_CHECKPOINT_EVERY_MINUTES)
    parser.add_argument("--intervals", type=int, default=None,
                        help="checkpoint intervals per disruption (default: 30 minutes' worth)")
    parser.add_argument("--kill-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-full-models", action="store_true")
    parser.add_argument("--throughput-seconds", type=float, default=0.0)
    parser.add_argument("--throughput-only", action="store_true")
    parser.add_argument("--auto", action="store_true",
                        help="checkpointEvery: auto (Young/Daly from the measured save)")
    args = parser.parse_args()
    if args.intervals is None:
        args.intervals = round(CYCLE_SECONDS / (60 * args.interval_minutes))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.throughput_only:
            report_throughput(throughput(root, args.throughput_seconds, args.interval_minutes))
            return
        runs, baseline = drill(root, args)
        saves = {} if args.no_full_models else {
            "mnist_cnn": save_seconds(root, "mnist_cnn"),
            "resnet50 (imageSize 32)": save_seconds(root, "resnet50", imageSize=32)}
        report(runs, baseline, args, saves)
        if args.throughput_seconds:
            report_throughput(*throughput(root, args.throughput_seconds, args.interval_minutes))


if __name__ == "__main__":
    main()
