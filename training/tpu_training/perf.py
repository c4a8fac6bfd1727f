"""How busy the TPU is, measured while the job trains: the perf line.

    tpu_training perf step=<N> examples_per_sec=<x> input_wait_share=<0..1> mfu=<0..1|na>

On a TPU the input pipeline runs on the host and the steps run on the device, so the
host cannot see the device wait: one execution of `stepsPerExecution` steps is a
single XLA program, and its `next(iterator)` is fed from the host's prefetch buffer
inside it. What the host can time is the whole execution. So the job also times the
device alone (`DeviceTime`): a probe runs the job's own training step (forward and
backward pass, the gradients' all-reduce, the optimizer's update of the weights and
its slots) on one batch made on the device (no input pipeline at all), at two sizes
(1 and n steps) to split a fixed cost per execution from a cost per step. An execution
of k steps that the pipeline does not hold up takes about `fixed + k * per_step`;
whatever it takes beyond that, it waited for input.

    input_wait_share = (execution seconds - device seconds) / wall seconds of the window
    examples_per_sec = steps * globalBatchSize / wall seconds of the window
    mfu = examples_per_sec * model FLOPs per example / the slice's peak FLOPs per second

The window is the wall time since the previous line (probes left out), so saves and
summaries count in it as they count in the job's wall time; the model FLOPs per example
are the job schema's (`config.train_flops_per_example`, 3 passes of 2 FLOPs per
multiply-add) and the peak is the slice's bf16 peak from components/catalog.py, which
the infra side puts in the resolved job as `peakFlopsPerSecond`. Off a TPU (the CPU
strategy) MFU is `na`: there is no peak to compare with.

Why not the profiler's input-pipeline analysis: it needs a trace written and converted
by the TensorBoard profile plugin, which the TPU image does not carry, and tracing costs
the job time while it runs. The probe costs a second of device time per line, plus a
copy of the model's and the optimizer's variables to host memory and back (12 bytes a
weight with Adam's two moments: about 4 GB for BERT-Large), which the job's wall time
pays but the window leaves out.

The probe runs the same program on the same shapes, so it needs what the steps need
when nothing holds them up; the share has no bias from leaving work out. Its error is
the timing's: the probe's two sizes and the window are each timed once, so load from
other processes on the host between them moves the share by their difference (on a
quiet TPU host a few thousandths; on a loaded 2-core CPU a cached in-memory dataset
read anywhere from 0 to 0.67), and the share is clipped at 0 when the executions ran
faster than the probe.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tpu_training.tf_env import tf

PERF_EVERY_EXECUTIONS = 50
FIRST_LINE_EXECUTIONS = 10  # an early line, so status has figures soon after the start
PROBE_SECONDS = 1.0  # the timed probe runs about this long (bounded by the notice)


@dataclasses.dataclass(frozen=True)
class DeviceTime:
    """What an execution of `steps` steps takes on the device alone."""

    fixed: float  # per execution: dispatch, the loop, the result's trip to the host
    per_step: float

    def seconds(self, steps: int) -> float:
        return self.fixed + steps * self.per_step

    @classmethod
    def from_probes(cls, one: float, steps: int, many: float | None) -> DeviceTime:
        """From a probe of one step (`one` seconds) and one of `steps` (`many` seconds)."""
        if many is None or steps < 2:
            return cls(0.0, one)
        per_step = (many - one) / (steps - 1)
        if per_step <= 0:  # noise: the longer probe alone
            return cls(0.0, many / steps)
        return cls(max(0.0, one - per_step), per_step)


@dataclasses.dataclass(frozen=True)
class Figures:
    step: int
    examples_per_sec: float
    input_wait_share: float
    mfu: float | None

    def line(self) -> str:
        """The perf line, without the `tpu_training ` prefix."""
        mfu = "na" if self.mfu is None else f"{self.mfu:.4f}"
        return (f"perf step={self.step} examples_per_sec={self.examples_per_sec:.3f} "
                f"input_wait_share={self.input_wait_share:.4f} mfu={mfu}")


def figures(step: int, *, steps: int, execution_seconds: float, device_seconds: float,
            wall_seconds: float, global_batch_size: int, flops_per_example: float | None,
            peak_flops_per_second: float | None) -> Figures:
    """The perf figures of one window (see the module's docstring)."""
    wall = max(wall_seconds, execution_seconds, 1e-9)
    wait = min(max(0.0, execution_seconds - device_seconds), wall)
    rate = steps * global_batch_size / wall
    mfu = None
    if flops_per_example and peak_flops_per_second:
        mfu = rate * flops_per_example / peak_flops_per_second
    return Figures(step, rate, wait / wall, mfu)


Probe = Callable[[int], float]  # runs n device-only steps, returns the wall seconds


@dataclasses.dataclass
class Window:
    executions: int = 0
    steps: int = 0
    execution_seconds: float = 0.0
    device_seconds: float = 0.0
    wall_seconds: float = 0.0


class PerfMeter:
    """Times executions against the device alone and prints the perf line when due.

    `measure_device` after the first execution (compilation), `executed` after every
    execution (the first is left out), `finish` once training stops.
    """

    def __init__(self, say: Callable[[str], None], *, global_batch_size: int,
                 max_probe_steps: int, probe: Probe | None,
                 flops_per_example: float | None, peak_flops_per_second: float | None,
                 probe_seconds: float = PROBE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.say, self.probe, self.clock = say, probe, clock
        self.global_batch_size, self.max_probe_steps = global_batch_size, max_probe_steps
        self.flops_per_example, self.peak = flops_per_example, peak_flops_per_second
        self.probe_seconds = probe_seconds
        self.device: DeviceTime | None = None
        self.window, self.total_executions = Window(), 0
        self.since_line = 0
        self.lines = 0
        self.last: Figures | None = None
        self._mark: float | None = None  # the window's wall clock runs from here
        self._compiled = False
        self._first: tuple[int, float] | None = None  # the compiling execution's steps, s

    def measure_device(self) -> None:
        """Probe the device alone (compiling the probe the first time); restart the window."""
        if self.probe is not None:
            if not self._compiled:
                self.probe(1)
                self._compiled = True
            one = self.probe(1)
            steps = max(1, min(self.max_probe_steps, int(self.probe_seconds / max(one, 1e-6))))
            many = self.probe(steps) if steps > 1 else None
            self.device = DeviceTime.from_probes(one, steps, many)
        self._mark = self.clock()

    def executed(self, step: int, steps: int, seconds: float) -> None:
        """One execution of `steps` steps took `seconds`; print the line when it is due."""
        self.total_executions += 1
        if self.total_executions == 1:
            self._first = (steps, seconds)  # compilation: not a measure of training
            if self._mark is None:
                self._mark = self.clock()
            return
        window = self.window
        window.executions += 1
        window.steps += steps
        window.execution_seconds += seconds
        window.device_seconds += self.device.seconds(steps) if self.device else seconds
        self.since_line += 1
        due = PERF_EVERY_EXECUTIONS if self.lines else FIRST_LINE_EXECUTIONS
        if self.since_line >= due:
            self._line(step)
            self.measure_device()  # again: the device's speed under today's load

    def finish(self, step: int) -> None:
        """The last line, before the job ends (none when it ran no execution)."""
        if not self.total_executions:
            return
        if self.window.executions or self.last is None:
            self._line(step)
        else:
            self.last = dataclasses.replace(self.last, step=step)
            self.say(self.last.line())

    def _line(self, step: int) -> None:
        window = self.window
        if window.executions:
            window.wall_seconds = self.clock() - (self._mark or self.clock())
        elif self._first is not None:  # a job of one execution: all there is
            steps, seconds = self._first
            window = Window(1, steps, seconds, seconds, seconds)
        self.last = figures(
            step, steps=window.steps, execution_seconds=window.execution_seconds,
            device_seconds=window.device_seconds, wall_seconds=window.wall_seconds,
            global_batch_size=self.global_batch_size,
            flops_per_example=self.flops_per_example, peak_flops_per_second=self.peak)
        self.say(self.last.line())
        self.lines += 1
        self.since_line = 0
        self.window = Window()
        self._mark = self.clock()


def device_probe(strategy: tf.distribute.Strategy, train_step: Callable,
                 state: list[tf.Variable], element_spec) -> Probe:
    """A probe of the device alone: `train_step(*batch)`, the job's whole training step
    (forward and backward pass, the gradients' all-reduce and the optimizer's update),
    on a batch of `element_spec` made on the device, n times; its result is not kept.

    The batch is zeros the compiler cannot see as constants (a zero drawn at run time),
    so nothing is folded away. Everything the steps change, `state` (the model's and the
    optimizer's variables: weights, BatchNorm statistics, moments, the step), is copied to
    host memory before a probe and written back after it, so training continues from
    where it was as if no probe had run.
    """
    specs = tf.nest.map_structure(_one_replica, element_spec)

    def replica_step() -> tf.Tensor:
        zero = tf.cast(tf.random.uniform([]) < 0.0, tf.float32)
        batch = tf.nest.map_structure(
            lambda spec: tf.fill(spec.shape, tf.cast(zero, spec.dtype)), specs)
        loss = train_step(*batch) if isinstance(batch, (tuple, list)) else train_step(batch)
        return tf.cast(loss, tf.float32)

    @tf.function
    def probe_steps(num_steps: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            total += strategy.reduce("sum", strategy.run(replica_step), axis=None)
        return total

    def probe(steps: int) -> float:
        kept = [variable.numpy() for variable in state]  # to the host: no device memory
        started = time.monotonic()
        probe_steps(tf.constant(steps)).numpy()  # waits for the device
        seconds = time.monotonic() - started
        for variable, value in zip(state, kept, strict=True):
            variable.assign(value)
        return seconds

    return probe


def _one_replica(spec):
    """One replica's TensorSpec of a distributed iterator's element spec (a PerReplicaSpec
    holds one per replica, all alike)."""
    if isinstance(spec, tf.TensorSpec):
        return spec
    return tf.nest.flatten(spec, expand_composites=True)[0]
