"""The perf line on two jobs in one run, on CPU: what it tells apart, and what it costs.

An input-bound job (a tiny ResNet on 32-pixel crops of large JPEGs, imagenet records)
and a compute-bound one (the MNIST CNN at half width on its small raw records), each
of `--executions` executions. Prints each job's last perf line, the ratio of their
input-wait shares, and the share of each job's wall time its device probes took
(tpu_training.perf: compiling the probe, then about a second per perf line).

    .venv/tf218/bin/python bench/perf_line.py [--executions 40]
"""

from __future__ import annotations

import argparse
import io
import re
import tempfile
import time

from tpu_training import models, perf, synth, train
from tpu_training import strategy as strategies
from tpu_training.config import JobConfig

SHARE = re.compile(r"input_wait_share=([0-9.]+)")


def timed_probes() -> list[float]:
    """Wrap the meter's device measurement to add up its seconds."""
    spent: list[float] = []
    measure = perf.PerfMeter.measure_device

    def timed(self: perf.PerfMeter) -> None:
        started = time.perf_counter()
        measure(self)
        spent.append(time.perf_counter() - started)

    perf.PerfMeter.measure_device = timed  # type: ignore[method-assign]
    return spent


def run(strategy, job: dict, root: str, spent: list[float]) -> tuple[str, float, float]:
    """The last perf line, the wall seconds, and the probes' seconds."""
    spent.clear()
    out = io.StringIO()
    config = JobConfig.from_dict({**job, "checkpointDir": f"{root}/ckpt",
                                  "exportDir": f"{root}/export", "tensorboardDir": f"{root}/tb"})
    started = time.perf_counter()
    train.run(config, strategy=strategy, out=out)
    wall = time.perf_counter() - started
    last = [line for line in out.getvalue().splitlines() if " perf " in line][-1]
    return last, wall, sum(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=40)
    args = parser.parse_args()
    strategy = strategies.make_strategy("cpu", 2)
    spent = timed_probes()
    steps = {"trainSteps": 2 * args.executions, "stepsPerExecution": 2,
             "checkpointEverySteps": 2 * args.executions, "checkpointEveryMinutes": 60}
    with tempfile.TemporaryDirectory() as root:
        jpegs = synth.write_dataset(f"{root}/jpegs", models.ModelSpec(
            "resnet18", (1024, 1024, 3), 10, 0.1), examples=64, shards=4,
            record_format="imagenet").pattern
        mnist = synth.write_dataset(f"{root}/mnist", models.ModelSpec(
            "mnist_cnn", (28, 28, 1), 10, 0.1), examples=1024, shards=16).pattern
        jobs = {
            "input-bound": {"model": "resnet18", "recordFormat": "imagenet", "imageSize": 32,
                            "numClasses": 10, "widthMultiplier": 0.0625,
                            "globalBatchSize": 16, "trainData": jpegs, **steps},
            "compute-bound": {"model": "mnist_cnn", "widthMultiplier": 0.5,
                              "globalBatchSize": 32, "learningRate": 0.1, "trainData": mnist,
                              **steps},
        }
        shares = {}
        for name, job in jobs.items():
            last, wall, probes = run(strategy, job, f"ram://bench-{name}", spent)
            shares[name] = float(SHARE.search(last)[1])
            print(f"{name:>13}: {last}")
            print(f"{'':>13}  wall {wall:.1f} s, device probes {probes:.1f} s "
                  f"({probes / wall:.1%} of it)")
    ratio = shares["input-bound"] / max(shares["compute-bound"], 1e-4)
    print(f"input-wait share, input-bound vs compute-bound: {ratio:.1f}x")


if __name__ == "__main__":
    main()
