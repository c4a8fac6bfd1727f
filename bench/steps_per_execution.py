"""Steps/s of the job's training loop with 1 vs 32 steps per execution, on CPU.

Each execution is one call of the job's `train_steps` tf.function followed by the
host work the job does between executions (reading the loss), fed from memory
so the input pipeline is not what is measured. TF's guide puts the gain of
`steps_per_execution` at about +50% on TPU (docs/tpu-facts.md); on CPU the
per-execution overhead is smaller, so expect less. The two settings are timed
in turns and each keeps its best round: a shared machine only slows runs down.

    .venv/tf218/bin/python bench/steps_per_execution.py [--steps 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from collections.abc import Callable

from tpu_training import models, train
from tpu_training import strategy as strategies
from tpu_training.config import JobConfig
from tpu_training.tf_env import tf

BASELINE, CANDIDATE = 1, 32
PER_REPLICA_BATCH = 16


def execution(strategy: tf.distribute.Strategy, per_execution: int, root: str) -> Callable:
    """One execution of the job's loop: `per_execution` steps, then the loss on the host."""
    config = JobConfig.from_dict({
        "model": "mnist_cnn", "trainData": "unused", "trainSteps": 10**6,
        "globalBatchSize": PER_REPLICA_BATCH * strategy.num_replicas_in_sync,
        "stepsPerExecution": per_execution, "checkpointEverySteps": per_execution,
        "widthMultiplier": 0.125, "checkpointDir": f"{root}/ckpt",
        "exportDir": f"{root}/export", "tensorboardDir": f"{root}/tb"})
    spec = models.model_spec(config)
    job = train.Job(config, spec, strategy, io.StringIO())
    train_steps = job.train_steps_fn()
    batch = (tf.zeros([PER_REPLICA_BATCH, *spec.image_shape]),
             tf.zeros([PER_REPLICA_BATCH], tf.int32))
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_tensors(batch).repeat()))
    steps = tf.constant(per_execution)

    def execute() -> float:
        train_steps(iterator, steps)
        return float(job.loss_metric.result())

    execute()  # trace and warm up
    return execute


def steps_per_second(execute: Callable, per_execution: int, steps: int) -> float:
    executions = steps // per_execution
    started = time.perf_counter()
    for _ in range(executions):
        execute()
    return executions * per_execution / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=256, help="timed steps per setting")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2, help="logical CPU replicas")
    args = parser.parse_args()
    strategy = strategies.make_strategy("cpu", args.replicas)
    rates = {BASELINE: 0.0, CANDIDATE: 0.0}
    with tempfile.TemporaryDirectory() as root:
        executions = {n: execution(strategy, n, f"{root}/{n}") for n in rates}
        for _ in range(args.rounds):
            for n, execute in executions.items():
                rates[n] = max(rates[n], steps_per_second(execute, n, args.steps))
    print(f"replicas: {strategy.num_replicas_in_sync}, mnist_cnn at 1/8 width, per-replica "
          f"batch {PER_REPLICA_BATCH}, best of {args.rounds} x {args.steps} steps each")
    for n, rate in rates.items():
        print(f"steps_per_execution={n:>2}: {rate:8.1f} steps/s")
    print(f"ratio {CANDIDATE} vs {BASELINE}: {rates[CANDIDATE] / rates[BASELINE]:.2f}x")


if __name__ == "__main__":
    main()
