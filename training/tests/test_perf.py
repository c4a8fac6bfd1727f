"""The perf line: the share of wall time the job waits for input, and its MFU."""

from __future__ import annotations

import io
import re
import time

import pytest

from tpu_training import data, models, perf, train
from tpu_training.config import JobConfig, train_flops_per_example
from tpu_training.tf_env import tf

PERF_LINE = re.compile(r"tpu_training perf step=(\d+) examples_per_sec=(\d+\.\d{3}) "
                       r"input_wait_share=([01]\.\d{4}) mfu=(na|\d+\.\d{4})")
# Twenty executions, as the issue asks of a short job; saves by steps only, at the end.
TWENTY_EXECUTIONS = {"trainSteps": 40, "stepsPerExecution": 2, "checkpointEverySteps": 40,
                     "checkpointEveryMinutes": 60}


def perf_lines(text: str) -> list[re.Match]:
    lines = [line for line in text.splitlines() if line.startswith("tpu_training perf ")]
    matches = [PERF_LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    return matches


def run_job(strategy, job: dict) -> list[re.Match]:
    out = io.StringIO()
    train.run(JobConfig.from_dict(job), strategy=strategy, out=out)
    return perf_lines(out.getvalue())


def locations(root: str) -> dict:
    return {"checkpointDir": f"{root}/ckpt", "exportDir": f"{root}/export",
            "tensorboardDir": f"{root}/tb"}


READ_LATENCY_SECONDS = 0.1  # a replica's batch, as a slow read from GCS waits for it


def slow_reads(dataset_fn):
    """`dataset_fn`, each batch held up by a wait that takes no CPU: a read's latency.

    A wait on the network leaves the CPU to the steps, as a TPU host's reads leave the
    device to them; decoding on the CPU would compete with the steps, which on a CPU
    strategy run on the same two cores, and move the share with the machine's load.
    """
    def wait(batch):
        tf.py_function(lambda: time.sleep(READ_LATENCY_SECONDS), [], [])
        return batch

    def slow(context):
        return dataset_fn(context).map(lambda *batch: wait(batch)).prefetch(1)

    return slow


def test_an_input_bound_job_waits_for_most_of_its_time(strategy, mnist_data):
    # A tiny CNN (a few milliseconds a step) whose batches each wait 0.1 s on their read:
    # about nine tenths of the time goes to waiting, and load on the machine slows the
    # steps, which the probe measures too, not the waits.
    job = JobConfig.from_dict({"model": "mnist_cnn", "widthMultiplier": 0.0625,
                               "globalBatchSize": 16, "trainData": mnist_data,
                               **TWENTY_EXECUTIONS, **locations("ram://input-bound")})
    spec = models.model_spec(job)
    records = data.make_dataset_fn(data.list_files(mnist_data), spec, job.globalBatchSize)
    out = io.StringIO()
    train.run(job, strategy=strategy, out=out, dataset_fn=slow_reads(records))
    lines = perf_lines(out.getvalue())
    assert [int(m[1]) for m in lines] == [22, 40]  # after 10 timed executions, and the end
    last = lines[-1]
    # About 0.9 at rest; 0.48 at a load average of 17 on 2 cores, whose slowed steps take
    # a larger part. A probe that missed the waits reads 0: a third of 0.9 still fails it.
    assert float(last[3]) > 0.3, last[0]
    assert last[4] == "na"  # on CPU: no peak to compare with


def test_a_compute_bound_job_hardly_waits(strategy, mnist_data):
    # The MNIST CNN at half width on its small raw records: the model is the work.
    job = {"model": "mnist_cnn", "widthMultiplier": 0.5, "globalBatchSize": 32,
           "trainData": mnist_data, "learningRate": 0.1, **TWENTY_EXECUTIONS,
           "peakFlopsPerSecond": 1e12, **locations("ram://compute-bound")}
    lines = run_job(strategy, job)
    last = lines[-1]
    assert float(last[3]) < 0.35, last[0]  # about 0.1 on a busy 2-core machine
    assert float(last[2]) > 0
    assert last[4] == "na"  # a peak in the job, but no TPU: still na


def test_the_probe_runs_the_whole_training_step_and_puts_every_variable_back(strategy):
    """What keeps a job whose input costs nothing near a share of 0: the device probe runs
    the job's own training step, the optimizer's update included (a probe without it read
    that update as waiting for input, 0.4 or more), n times, then restores the state.

    Checked by what the probe changes, not by a share: a share is a timing, which load on
    a shared machine moves (a cached in-memory bert_tiny job read 0.0 to 0.04 with one
    core busy, 0.67 at a load average of 17 on 2 cores); the shares a job reads are
    bench/'s to measure."""
    from tpu_training.tf_env import keras

    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(4)])
        model.build((None, 3))
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)

    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features) - labels))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    spec = (tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([2, 4], tf.float32))
    weights = [variable.numpy() for variable in model.variables]
    # Only the model's weights kept: the optimizer's step count shows what ran.
    partial = perf.device_probe(strategy, train_step, list(model.variables), spec)
    assert partial(3) > 0
    assert int(optimizer.iterations.numpy()) == 3  # three steps, each with its update
    assert all((variable.numpy() == kept).all()
               for variable, kept in zip(model.variables, weights, strict=True))
    # The job's state, the optimizer's too: after a probe, as if none had run.
    state = [*model.variables, *optimizer.variables]
    before = [variable.numpy() for variable in state]
    assert perf.device_probe(strategy, train_step, state, spec)(5) > 0
    assert int(optimizer.iterations.numpy()) == 3
    assert all((variable.numpy() == kept).all()
               for variable, kept in zip(state, before, strict=True))


def test_figures_of_a_window():
    # 10 executions of 5 steps of 64 examples in 20 s of wall time; 12 s of them on the
    # device's own time: 8 s of waiting.
    got = perf.figures(50, steps=50, execution_seconds=18.0, device_seconds=10.0,
                       wall_seconds=20.0, global_batch_size=64, flops_per_example=1e9,
                       peak_flops_per_second=4e11)
    assert got.examples_per_sec == pytest.approx(160.0)
    assert got.input_wait_share == pytest.approx(0.4)
    assert got.mfu == pytest.approx(160.0 * 1e9 / 4e11)
    assert got.line() == ("perf step=50 examples_per_sec=160.000 input_wait_share=0.4000 "
                          "mfu=0.4000")
    faster = perf.figures(50, steps=50, execution_seconds=9.0, device_seconds=10.0,
                          wall_seconds=20.0, global_batch_size=64, flops_per_example=None,
                          peak_flops_per_second=4e11)
    assert faster.input_wait_share == 0.0 and faster.mfu is None
    assert faster.line().endswith(" mfu=na")


def test_device_time_splits_the_cost_of_an_execution_from_a_step():
    device = perf.DeviceTime.from_probes(0.15, 11, 1.15)  # 0.1 s a step, 0.05 s fixed
    assert device.per_step == pytest.approx(0.1) and device.fixed == pytest.approx(0.05)
    assert device.seconds(5) == pytest.approx(0.55)
    assert perf.DeviceTime.from_probes(0.3, 1, None) == perf.DeviceTime(0.0, 0.3)
    noisy = perf.DeviceTime.from_probes(0.3, 4, 0.2)  # the longer probe was quicker
    assert noisy == perf.DeviceTime(0.0, 0.05)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_every_50_executions_and_at_the_end():
    clock, said, probes = Clock(), [], []

    def probe(steps: int) -> float:
        probes.append(steps)
        return 0.01 * steps

    meter = perf.PerfMeter(said.append, global_batch_size=8, max_probe_steps=4, probe=probe,
                           flops_per_example=None, peak_flops_per_second=None, clock=clock)
    meter.executed(4, 4, 30.0)  # the first, compiling execution: left out
    meter.measure_device()
    assert probes == [1, 1, 4]  # compile, one step, then as many as fit (at most 4)
    for execution in range(2, 131):
        clock.now += 0.1
        meter.executed(4 * execution, 4, 0.1)
    meter.finish(520)
    steps = [int(line.split()[1].removeprefix("step=")) for line in said]
    assert steps == [44, 244, 444, 520]  # after 10, then every 50, then the end
    # Each execution took 0.1 s, of which the device needs 0.04 s: 60% waiting.
    assert all(" input_wait_share=0.6000 " in line for line in said), said
    assert all(line.endswith(" mfu=na") for line in said)


def test_a_job_of_one_execution_still_prints_its_line():
    said = []
    meter = perf.PerfMeter(said.append, global_batch_size=8, max_probe_steps=1, probe=None,
                           flops_per_example=1e6, peak_flops_per_second=1e9, clock=Clock())
    meter.executed(3, 3, 2.0)
    meter.finish(3)
    assert said == ["perf step=3 examples_per_sec=12.000 input_wait_share=0.0000 mfu=0.0120"]


def test_the_resolved_job_carries_the_slices_peak():
    job = JobConfig.from_dict({"model": "resnet50", "trainData": "d/*", "globalBatchSize": 8,
                               "trainSteps": 10, "stepsPerExecution": 10}, resolved=False)
    node = job.resolve(data_root="gs://d", checkpoint_dir="gs://c/", export_dir="gs://e/",
                       tensorboard_dir="gs://t/", notice_seconds=30,
                       peak_flops_per_second=4 * 275e12)
    assert node.peakFlopsPerSecond == 1.1e15
    assert JobConfig.from_dict(node.to_dict()) == node
    assert train_flops_per_example(job) > 0
