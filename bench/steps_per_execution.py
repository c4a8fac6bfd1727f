"""Steps/s of the job's training loop with 1 vs 32 steps per execution, on CPU.

Each execution is one call of the job's `train_steps` tf.function followed by the
host work the job does between executions (reading the loss), fed from memory
so the input pipeline is not what is measured. TF's guide puts the gain of
`steps_per_execution` at about +50% on TPU (tpu-facts.md); on CPU the
per-execution overhead is smaller, so expect less.

    .venv/tf218/bin/python bench/steps_per_execution.py [--steps 256] [--replicas 2]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

from tpu_training import models, train
from tpu_training import strategy as strategies
from tpu_training.config import JobConfig
from tpu_training.tf_env import tf

BASELINE, CANDIDATE = 1, 32


def steps_per_second(strategy: tf.distribute.Strategy, per_execution: int, steps: int,
                     root: str) -> float:
    replicas = strategy.num_replicas_in_sync
    config = JobConfig.from_dict({
        "model": "mnist_cnn", "trainData": "unused", "globalBatchSize": 16 * replicas,
        "trainSteps": steps, "stepsPerExecution": per_execution,
        "checkpointEverySteps": per_execution, "widthMultiplier": 0.125,
        "checkpointDir": f"{root}/ckpt", "exportDir": f"{root}/export",
        "tensorboardDir": f"{root}/tb"})
    spec = models.model_spec(config)
    job = train.Job(config, spec, strategy, io.StringIO())
    train_steps = job.train_steps_fn()
    batch = (tf.zeros([16, *spec.image_shape]), tf.zeros([16], tf.int32))
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_tensors(batch).repeat()))
    executions = steps // per_execution

    def execute() -> float:
        train_steps(iterator, tf.constant(per_execution))
        return float(job.loss_metric.result())

    execute()  # trace and warm up
    started = time.perf_counter()
    for _ in range(executions):
        execute()
    return executions * per_execution / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=256, help="timed steps per setting")
    parser.add_argument("--replicas", type=int, default=2, help="logical CPU replicas")
    args = parser.parse_args()
    strategy = strategies.make_strategy("cpu", args.replicas)
    with tempfile.TemporaryDirectory() as root:
        rates = {n: steps_per_second(strategy, n, args.steps, root) for n in (BASELINE, CANDIDATE)}
    print(f"replicas: {strategy.num_replicas_in_sync}, model: mnist_cnn at 1/8 width, "
          f"per-replica batch 16, {args.steps} timed steps each")
    for n, rate in rates.items():
        print(f"steps_per_execution={n:>2}: {rate:8.1f} steps/s")
    print(f"ratio {CANDIDATE} vs {BASELINE}: {rates[CANDIDATE] / rates[BASELINE]:.2f}x")


if __name__ == "__main__":
    main()
