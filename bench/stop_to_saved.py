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
  (`checkpointEveryMinutes` 0.001: the interval has passed at every execution's end)
  and SIGTERM sent 0.2 s after the first step line `--after` seconds in: inside the
  next execution, that execution's save still writing. The stop finishes the execution,
  waits for the save in flight, then saves (the worst case model/stop_save.py
  budgets: one execution and two saves). A small `--notice` (short executions) makes
  the save outlast the execution, as a large checkpoint on GCS does on a TPU.
  `in flight` says whether that save's `saved` line came between the signal and the
  stop save (`save s` is then its seconds; when it saved the step reached, the job
  prints `stopped_at` without a second save, which then ends the stop).

SIGTERM is sent `--after` seconds past the job's `resumed_from` line, so in the first
two runs it lands inside an execution. A run that has not saved `--limit` seconds after the signal
is killed and reported as more than that. Saves go to local disk (GCS is not reachable
here); the preview adds the GCS estimate (model/stop_save.py). CPU step times are
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
IN_FLIGHT_MINUTES = 0.001  # a save after every execution
IN_FLIGHT_DELAY_SECONDS = 0.2  # after a step line: inside the next execution
RUNS = {"bounded": 600, "unbounded": 600, "in flight": IN_FLIGHT_MINUTES}  # save interval
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
                # This execution's save starts now; the signal lands in the next
                # execution, with the save still writing.
                time.sleep(IN_FLIGHT_DELAY_SECONDS)
                process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
        elif INTERVAL_SAVED.match(line) and signalled is not None and result["saved"] is None:
            result["in_flight"] = True
            result["save"] = float(re.search(r"seconds=([\d.]+)", line)[1])
        elif line.startswith("tpu_training stopped_at=") and result["saved"] is None:
            # The step was already saved (the save in flight): no stop save line.
            result["saved"] = time.monotonic() - signalled if signalled else None
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
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
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
            for run in args.runs:
                notice = None if run == "unbounded" else args.notice
                minutes = RUNS[run]
                extra = {} if notice is None else {"noticeSeconds": notice}
                config = write_config(root / f"{name}-{run.replace(' ', '-')}", data,
                                      stepsPerExecution=100, checkpointEverySteps=100_000,
                                      checkpointEveryMinutes=minutes, **shape, **extra)
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
