"""Stop to saved: seconds from SIGTERM to the stop checkpoint, as a share of a stop notice.

The node agent sends SIGTERM the moment a preemption notice arrives; a spot VM powers
off 30 s later (docs/tpu-facts.md, "Preemption notice"). The job finishes the execution
under way, then saves. Here mnist_cnn and resnet50 (full size, imageSize 224) run at
their default steps per execution (100) on the CPU, twice each in the same run:

- bounded: with `noticeSeconds` (what a node's job carries, contract C3): executions
  sized from the measured step time to a quarter of the notice (tpu_training.train,
  `ExecutionSizer`);
- unbounded: without it, every execution `stepsPerExecution` steps (the job before).

- in flight: bounded, with an asynchronous interval save after every execution
  (`checkpointEverySteps` 1) and SIGTERM sent on the first step line `--after` seconds
  in, the moment that execution's save starts writing: the stop waits for the save in
  flight, then saves (the worst case components/stop_save.py budgets: one execution
  and two saves). `in flight` says whether that save's `saved` line came between the
  signal and the stop save.

SIGTERM is sent `--after` seconds past the job's `resumed_from` line, so in the first
two runs it lands inside an execution. A run that has not saved `--limit` seconds after the signal
is killed and reported as more than that. Saves go to local disk (GCS is not reachable
here); the preview adds the GCS estimate (components/stop_save.py). CPU step times are
far longer than a TPU's: the figure is the share of the notice, and whether it fits.

    PYTHONPATH=$PWD:$PWD/training .venv/tf218/bin/python bench/stop_to_saved.py
"""

from __future__ import annotations

import argparse
import queue
import re
import signal
import tempfile
import time
from pathlib import Path

from bench.preemption_drill import dataset, start_job, write_config

MODELS = {"mnist_cnn": {"model": "mnist_cnn", "globalBatchSize": 16},
          "resnet50": {"model": "resnet50", "imageSize": 224, "globalBatchSize": 4}}
SAVED = re.compile(r"tpu_training saved step=(\d+) seconds=([\d.]+) .*reason=stop")
INTERVAL_SAVED = re.compile(r"tpu_training saved step=\d+ .*reason=(steps|minutes)")
STEP = re.compile(r"tpu_training step=(\d+) ")


def stop_to_saved(config: Path, after: float, limit: float, on_step: bool = False) -> dict:
    """Run the job, SIGTERM it `after` s into training (`on_step`: at the first step
    line after that); seconds to its stop save."""
    process, lines = start_job(config)
    result: dict = {"steps": [], "saved": None, "save": None, "in_flight": False}
    started = signalled = None
    while True:
        now = time.monotonic()
        if started is not None and signalled is None and now - started >= after and \
                not on_step:
            process.send_signal(signal.SIGTERM)
            signalled = now
        if signalled is not None and now - signalled > limit:
            process.kill()
            break
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            break
        if line.startswith("tpu_training resumed_from="):
            started = time.monotonic()
        elif match := STEP.match(line):
            result["steps"].append(int(match[1]))
            if on_step and signalled is None and started is not None and \
                    time.monotonic() - started >= after:
                process.send_signal(signal.SIGTERM)  # this execution's save starts now
                signalled = time.monotonic()
        elif INTERVAL_SAVED.match(line) and signalled is not None and result["saved"] is None:
            result["in_flight"] = True
        elif (match := SAVED.match(line)) and signalled is not None:
            result["saved"], result["save"] = time.monotonic() - signalled, float(match[2])
    process.wait(timeout=60)
    result["code"] = process.returncode
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notice", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=25.0)
    parser.add_argument("--limit", type=float, default=90.0)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    print(f"| model | steps per execution | run | executions before the stop (steps) "
          f"| stop to saved | share of the {args.notice:g} s notice | save s | in flight "
          f"| exit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in args.models:
            shape = MODELS[name]
            data = dataset(root / f"{name}-data", **shape)
            for run, notice, every in (("bounded", args.notice, 100_000),
                                       ("unbounded", None, 100_000),
                                       ("in flight", args.notice, 1)):
                extra = {} if notice is None else {"noticeSeconds": notice}
                config = write_config(root / f"{name}-{run.replace(' ', '-')}", data,
                                      stepsPerExecution=100, checkpointEverySteps=every,
                                      checkpointEveryMinutes=600, **shape, **extra)
                result = stop_to_saved(config, args.after, args.limit,
                                       on_step=run == "in flight")
                saved = result["saved"]
                seconds = f"{saved:.1f} s" if saved is not None else f"> {args.limit:g} s"
                share = (saved if saved is not None else args.limit) / args.notice
                share_text = f"{share:.2f}" if saved is not None else f"> {share:.1f}"
                save = f"{result['save']:.2f}" if result["save"] is not None else "-"
                flight = "yes" if result["in_flight"] else "no"
                print(f"| {name} | 100 | {run} | {result['steps'] or '-'} | {seconds} "
                      f"| {share_text} | {save} | {flight} | {result['code']} |", flush=True)


if __name__ == "__main__":
    main()
