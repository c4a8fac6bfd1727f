"""The training job: restore, train in multi-step executions, checkpoint, export.

Shaped like tensorflow/models `official/legacy/image_classification/mnist_main.py`:
`run(config, strategy=..., dataset_fn=...)` takes its strategy and input as
overridable arguments, so tests inject CPU versions.

A custom loop rather than `fit`, because resume needs the step: one `tf.function`
runs up to `stepsPerExecution` steps on device (`tf.range` around `strategy.run`,
tensorflow.org/guide/tpu, "Improving performance with multiple steps inside
tf.function"); between executions the host prints progress, writes summaries,
checkpoints every `checkpointEverySteps` or `checkpointEveryMinutes`, whichever
comes first (model, optimizer, step) and checks for SIGTERM.

The stop flag is read only between executions: the steps of one execution are one
XLA program on the TPU, which a host flag cannot reach (a host-side check inside the
loop would need outside compilation, a host round trip every step). So with a
`noticeSeconds` the job sizes its executions instead (`ExecutionSizer`): the first
two run one step (compilation, then a measurement), later ones as many steps as fit
`JobConfig.max_execution_seconds` at the measured step time, never more than
`stepsPerExecution` nor twice the last execution.

Interval saves are asynchronous (`tf.train.CheckpointOptions(
experimental_enable_async_checkpoint=True)`, tensorflow/python/checkpoint/
async_checkpoint_helper.py, the same in TF 2.18 and 2.20): training waits only while
the weights are copied to host memory (`_copy_to_cpu`; every `DistributedVariable`,
so every TPUStrategy variable, implements `_copy_trackable_to_cpu`,
tensorflow/python/distribute/values.py); a thread writes them through the same
checkpoint writer as a synchronous save, so gs:// works alike. CheckpointManager's
state file is written by the write's callback, after the data (checkpoint.py,
`Checkpoint._write` runs `experimental_write_callbacks` after `_saver.save`), so a kill
during a write leaves the previous checkpoint the latest. A `saved` line is printed once
the write is done and the state file names it: the manager appends its state-writing
callback after the job's own (checkpoint_management.py, `CheckpointManager.save`:
`options.experimental_write_callbacks.append(_record_and_sweep_state)`; checkpoint.py,
`_execute_callbacks` runs them in order; the same in TF 2.18 and 2.20), so the job's
callback alone may come first. The stop and final saves are synchronous, after any write
under way, as TF's own preemption save is (checkpoint.py, `in_preemption_save_context`).

Progress lines on stdout, which the node agent parses (docs/design.md, "Job stdout lines"),
each in one write (tpu_training.output, which also keeps the job going when the pipe
loses its reader: `output_orphaned`):

    tpu_training started stacks=SIGUSR1 tpu_init_seconds=<s>   first (tpu_training.__main__)
    tpu_training tpu_ready replicas=<n>    the strategy is made (the TPU initialised)
    tpu_training handlers_reinstalled signals=<…> replaced_by=<…>   after tpu_ready or an
                                           execution, when another replaced a handler
    tpu_training recipe optimizer=<sgd|adamw|lamb> peak_learning_rate=<x> warmup_steps=<n> \
        decay=<cosine|linear> clip_norm=<x|none> weight_decay=<x|none>   once (config.recipe)
    tpu_training initialised_from=<path> format=<tf1|tf2> variables=<n>   a fresh BERT job
                                           with initCheckpoint, before resumed_from=0
    tpu_training resumed_from=<N>          once, at start (0: fresh)
    tpu_training step=<N> loss=<float>     once per execution
    tpu_training saved step=<N> seconds=<s> bytes=<b> reason=<steps|minutes|stop|final> \
        blocked=<s>
    tpu_training checkpoint_interval seconds=<s> save_cost=<s> mtbf=<s> \
        reason=<young_daly|write_bound>   checkpointEvery: auto, after an interval save
                                           when the interval it chooses first applies or moves
    tpu_training goodput step=<N> productive=<s> tpu_init=<s> …   after every step and
                                           saved line, and at exit (tpu_training.goodput)
    tpu_training perf step=<N> examples_per_sec=<x> input_wait_share=<s> mfu=<u|na>
                                           every 50 executions (first after 10) and at
                                           the end of training (tpu_training.perf)
    tpu_training eval_progress step=<N> batch=<i>   evaluating step N: after the first batch,
                                           then at most every 10 s
    tpu_training eval_accuracy=<x> eval_loss=<y>   at the end, with evalData (BERT: masked-LM
                                           accuracy, and eval_nsp_accuracy=<z> after them)
    tpu_training stopped_at=<N>            SIGTERM: checkpoint saved, exit 75
    tpu_training complete=<N> export=<dir> finished (or found finished): exit 0
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tpu_training import bert, bert_data, data, models, output, perf
from tpu_training import strategy as strategies
from tpu_training.config import (
    AUTO_CHECKPOINT,
    AUTO_INTERVAL_CHANGE,
    LOCATION_KEYS,
    CheckpointInterval,
    JobConfig,
    JobConfigError,
    checkpoint_interval,
    recipe,
    train_flops_per_example,
)
from tpu_training.exits import StopSaveError
from tpu_training.goodput import Goodput
from tpu_training.stopping import StopFlag
from tpu_training.tf_env import keras, tf

COMPLETE_MARKER = "tpu_training_complete.json"
EVAL_PROGRESS_SECONDS = 10.0  # evaluation says how far it got at most this often
CHECKPOINTS_KEPT = 3


class Outcome(enum.Enum):
    FINISHED = "finished"
    ALREADY_COMPLETE = "already complete"
    STOPPED = "stopped"


@dataclasses.dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    step: int
    resumed_from: int
    losses: tuple[float, ...] = ()  # one per execution of this run


def run(config: JobConfig, *, strategy: tf.distribute.Strategy | None = None,
        dataset_fn: data.DatasetFn | None = None, stop: StopFlag | None = None,
        out: TextIO | None = None, goodput: Goodput | None = None) -> RunResult:
    """Train `config` to `trainSteps`, resuming from its latest checkpoint, then export.

    Prints the goodput line of this run at its end, also when it fails.
    """
    goodput, out = goodput or Goodput(), out or sys.stdout
    own_stop = stop is None
    stop = StopFlag().install() if own_stop else stop
    reached = [0]  # the step the job has reached, for the goodput line at exit
    try:
        return _run(config, strategy, dataset_fn, stop, out, goodput, reached)
    finally:
        _say(out, goodput.line(reached[0]))
        goodput.close()
        if own_stop:
            stop.uninstall()


def _run(config: JobConfig, strategy: tf.distribute.Strategy | None,
         dataset_fn: data.DatasetFn | None, stop: StopFlag, out: TextIO,
         goodput: Goodput, reached: list[int]) -> RunResult:
    _require_locations(config)
    done = read_marker(config.exportDir)
    if done is not None and done["step"] >= config.trainSteps:
        reached[0] = done["step"]
        if done.get("evaluation") == "unfinished":
            output.tell(f"the evaluation of step {done['step']} did not finish in an earlier "
                        f"run; the export is in place, so it is not run again")
        _say(out, f"complete={done['step']} export={config.exportDir}")
        return RunResult(Outcome.ALREADY_COMPLETE, done["step"], done["step"])
    # First: a TPU must initialise, and CPUs be split, before TensorFlow runs any op.
    with goodput.timed("tpu_init"):
        strategy = strategy or strategies.make_strategy(stopped=lambda: stop.requested)
    _say(out, f"tpu_ready replicas={strategy.num_replicas_in_sync}")
    restore_handlers(stop, out)
    check_batch(config.globalBatchSize, strategy.num_replicas_in_sync)
    _say(out, recipe(config).line())
    spec = models.model_spec(config)
    eval_dataset_fn = None
    with goodput.timed("program_startup", phase="data_loading"):
        if dataset_fn is None:
            dataset_fn = _dataset_fn(config.trainData, spec, config, training=True)
        if config.evalData is not None:
            eval_dataset_fn = _dataset_fn(config.evalData, spec, config, training=False)
    with goodput.timed("program_startup", phase="training_preparation"):
        job = Job(config, spec, strategy, out, goodput)
    try:
        return job.run(dataset_fn, stop, eval_dataset_fn)
    except tf.errors.InvalidArgumentError as error:
        # A record further in than the one checked at start may not parse (BERT's
        # fixed-length features): one error naming the feature, exit 65. Past
        # trainSteps only the evaluation reads records.
        key = "evalData" if job.step >= config.trainSteps else "trainData"
        records = (bert_data.records_error(error, spec, key)
                   if isinstance(spec, bert.BertSpec) else None)
        if records is None:
            raise
        raise records from error
    finally:
        reached[0] = job.step


def check_batch(global_batch_size: int, replicas: int) -> None:
    if global_batch_size % replicas:
        raise JobConfigError.single(
            "globalBatchSize", f"{global_batch_size} is not divisible by the {replicas} "
                               f"replicas of this strategy; use a multiple of {replicas}")


def read_marker(export_dir: str) -> dict | None:
    """The completion marker of a finished job; None if absent or torn by a kill."""
    path = _join(export_dir, COMPLETE_MARKER)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as marker:
        try:
            return json.load(marker)
        except ValueError:  # the job exports again from its last checkpoint
            return None


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak` over `warmup_steps`, then cosine decay to 0 at `total_steps`."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak, self.warmup_steps, self.total_steps = peak, warmup_steps, total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = float(max(self.warmup_steps, 1))
        progress = tf.minimum(1.0, (step - warmup) / float(max(self.total_steps - warmup, 1)))
        decayed = 0.5 * self.peak * (1.0 + tf.cos(math.pi * progress))
        return tf.where(step < warmup, self.peak * step / warmup, decayed)

    def get_config(self) -> dict:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


def learning_rate(config: JobConfig, spec: models.ModelSpec | bert.BertSpec
                  ) -> keras.optimizers.schedules.LearningRateSchedule:
    """config.recipe's schedule: image models warm up, then decay on a cosine; BERT as
    `bert.learning_rate` says (warm-up from 0, linear decay)."""
    if isinstance(spec, bert.BertSpec):
        return bert.learning_rate(config)
    resolved = recipe(config)
    return WarmupCosine(resolved.peak_learning_rate, resolved.warmup_steps, config.trainSteps)


def precision_policy(strategy: tf.distribute.Strategy) -> str:
    """bfloat16 compute on TPU (docs/tpu-facts.md, "tf.data on TPU"); float32 elsewhere."""
    return "mixed_bfloat16" if isinstance(strategy, tf.distribute.TPUStrategy) else "float32"


class Job:
    """One job's model, optimizer, checkpoints and summaries, built under `strategy`."""

    def __init__(self, config: JobConfig, spec: models.ModelSpec | bert.BertSpec,
                 strategy: tf.distribute.Strategy, out: TextIO, goodput: Goodput | None = None):
        self.config, self.spec, self.strategy, self.out = config, spec, strategy, out
        self.task = models.task_for(spec)
        self.goodput = goodput or Goodput()
        keras.mixed_precision.set_global_policy(precision_policy(strategy))
        with strategy.scope():
            self.model = self.task.build_model()
            self.optimizer = self.task.optimizer(config, learning_rate(config, spec))
            self.optimizer.build(self.model.trainable_variables)
            self.loss_metric = keras.metrics.Mean("loss")
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                         step=self.optimizer.iterations)
        self.manager = tf.train.CheckpointManager(checkpoint, config.checkpointDir,
                                                  max_to_keep=CHECKPOINTS_KEPT)
        self.writer = tf.summary.create_file_writer(config.tensorboardDir)
        self.saved_step: int | None = None  # the step of the newest checkpoint written
        self.pending: PendingSave | None = None  # the save being written, or not reported
        self.last_save = time.monotonic()  # when the last save began, or training began
        # The time between interval saves: checkpointEveryMinutes, or with
        # `checkpointEvery: auto` Young/Daly's once a save has been measured.
        self.interval_seconds = 60 * config.checkpointEveryMinutes
        self.interval: CheckpointInterval | None = None

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def run(self, dataset_fn: data.DatasetFn, stop: StopFlag,
            eval_dataset_fn: data.DatasetFn | None = None) -> RunResult:
        with self.goodput.timed("checkpoint_restore"):
            resumed_from = self._restore()
        _say(self.out, f"resumed_from={resumed_from}")
        # The input continues the epoch where the checkpoint's step left it (data.EpochInput).
        with self.goodput.timed("program_startup", phase="training_preparation"):
            iterator = iter(self.strategy.distribute_datasets_from_function(
                data.starting_at(dataset_fn, self.step)))
        losses = self._train_then_save(iterator, stop)
        if self.step < self.config.trainSteps:
            self.goodput.trained(self.step)
            self.goodput.winding_down()
            _say(self.out, f"stopped_at={self.step}")
            return RunResult(Outcome.STOPPED, self.step, resumed_from, losses)
        self._average_replica_statistics()
        # Export first: a run stopped or hung during the evaluation finds the export
        # (its marker) when it starts again, and ends at once instead of evaluating again.
        with self.goodput.timed("checkpoint_save"):
            self._export(evaluating=eval_dataset_fn is not None)
        self.goodput.trained(self.step)
        if eval_dataset_fn is not None:
            metrics = self.evaluate(eval_dataset_fn)
            self._write_marker(metrics)
        _say(self.out, f"complete={self.step} export={self.config.exportDir}")
        self.goodput.finished()
        self.goodput.winding_down()
        return RunResult(Outcome.FINISHED, self.step, resumed_from, losses)

    def _average_replica_statistics(self) -> None:
        """Give every replica the replicas' mean of the BatchNorm moving statistics.

        Keras keeps them sync-on-read (tf_keras BatchNormalization: ON_READ, MEAN), so
        each replica updates its own copy from its own batches, while a checkpoint and
        the export hold their mean (tensorflow/python/distribute/values.py,
        SyncOnReadVariable: a cross-replica read reduces, a cross-replica assign sets
        every copy). With the mean, the job evaluates the model it exports.
        """
        for variable in self.model.non_trainable_variables:
            if variable.synchronization == tf.VariableSynchronization.ON_READ:
                variable.assign(variable.read_value())

    def _restore(self) -> int:
        latest = self.manager.latest_checkpoint
        if latest is None:
            if self.config.initCheckpoint:
                self._initialise(self.config.initCheckpoint)
            return 0
        try:
            self.manager.checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError) as error:
            raise JobConfigError.single(
                "checkpointDir", f"{latest} is not a checkpoint of this {self.spec.name} job: "
                                 f"{error}") from error
        self.saved_step = self.step
        return self.step

    def _initialise(self, path: str) -> None:
        """Start from a published BERT checkpoint (`initCheckpoint`): the encoder, and the
        pre-training heads it has (tpu_training.bert_checkpoint)."""
        layout, tensors = bert.published_tensors(path, self.spec, source="initCheckpoint")
        assigned = bert.assign_published(self.model, tensors)
        _say(self.out, f"initialised_from={path} format={layout} variables={assigned}")

    def _train_then_save(self, iterator, stop: StopFlag) -> tuple[float, ...]:
        """Train until trainSteps or a stop signal, then save (reason final or stop).

        Once a stop signal has arrived, a failure of the execution under way or of the
        save is a StopSaveError (exit 76): on a pod slice the other hosts may be going
        down first, and the node was being stopped anyway.
        """
        try:
            losses = self._train(iterator, self.train_steps_fn(), stop, self.perf_meter(iterator))
            self._save("final" if self.step >= self.config.trainSteps else "stop")
        except tf.errors.OpError as error:
            if not stop.requested:
                raise
            raise StopSaveError(f"stopped by signal {stop.signal} at step {self.step} but "
                                f"the stop save failed: {type(error).__name__}: "
                                f"{_summary(error.message)}") from error
        return losses

    def _train(self, iterator, train_steps: Callable, stop: StopFlag,
               meter: perf.PerfMeter) -> tuple[float, ...]:
        config, losses = self.config, []
        sizer = ExecutionSizer(config)
        self.last_save = time.monotonic()
        while self.step < config.trainSteps and not stop.requested:
            before, started = self.step, time.monotonic()
            steps = sizer.next_steps(before)
            train_steps(iterator, tf.constant(steps))
            first = not losses  # this process's first execution: tracing and compilation
            loss = float(self.loss_metric.result())
            self.loss_metric.reset_state()
            losses.append(loss)
            seconds = time.monotonic() - started
            sizer.measured(steps, seconds)
            _say(self.out, f"step={self.step} loss={loss:.6f}")
            _say(self.out, self.goodput.line(self.step))
            if first:  # after the line, so the agent hears of the step before the probe
                meter.measure_device()  # the device alone, for the perf line: start-up too
                self.goodput.started_training()
            # After the probe: to the observer, as to the accounting, this process's
            # first execution runs until training has started.
            self.goodput.executed(before, steps, time.monotonic() - started)
            self._summarise(loss, steps / seconds)
            self._report_written(wait=False)
            reason = self._save_reason(before)
            if reason:
                self._save(reason, asynchronous=True)
            meter.executed(self.step, steps, seconds)
            restore_handlers(stop, self.out)  # libtpu may install its own lazily
        meter.finish(self.step)
        return tuple(losses)

    def _save_reason(self, before: int) -> str | None:
        """`steps` or `minutes` when an interval has passed since `before`, else None."""
        every = self.config.checkpointEverySteps
        if self.step // every > before // every:
            return "steps"
        if time.monotonic() - self.last_save >= self.interval_seconds:
            return "minutes"
        return None

    def _save(self, reason: str, *, asynchronous: bool = False) -> None:
        """Save the step unless it is saved (or being written); a synchronous save first
        waits for a write under way. Its `saved` line follows once it is written."""
        pending = self.pending
        if self.saved_step != self.step and (pending is None or pending.step != self.step):
            self._report_written(wait=True)  # the manager would wait for it anyway
            with self.goodput.timed("checkpoint_save"):
                save = PendingSave(self.step, reason, time.monotonic())
                options = tf.train.CheckpointOptions(
                    experimental_enable_async_checkpoint=asynchronous,
                    experimental_write_callbacks=[save.written])
                save.path = self.manager.save(checkpoint_number=self.step, options=options)
                save.blocked = time.monotonic() - save.started
            self.pending, self.last_save = save, time.monotonic()
        if not asynchronous:
            self._report_written(wait=True)
        self.writer.flush()

    def _report_written(self, *, wait: bool) -> None:
        """Print the `saved` line of the save being written once it is written (`wait`:
        wait for it). A failed asynchronous write is raised by the next save."""
        save = self.pending
        if save is None:
            return
        if wait:  # returns once the writing thread ran every callback (the state's too)
            with self.goodput.timed("checkpoint_save"):
                self.manager.sync()
        if save.done is None or not (wait or self._state_names(save)):
            return
        self.pending, self.saved_step = None, save.step
        with self.goodput.timed("checkpoint_save"):
            size = checkpoint_bytes(save.path)
        _say(self.out, f"saved step={save.step} seconds={save.done - save.started:.3f} "
                       f"bytes={size} reason={save.reason} blocked={save.blocked:.3f}")
        _say(self.out, self.goodput.line(self.step))
        if save.reason in ("steps", "minutes"):
            self._choose_interval(save)

    def _choose_interval(self, save: PendingSave) -> None:
        """`checkpointEvery: auto`: Young/Daly's interval from this interval save's cost
        and the node's disruptions; printed when it first applies or moves by more than
        AUTO_INTERVAL_CHANGE."""
        config = self.config
        if config.checkpointEvery != AUTO_CHECKPOINT or config.mtbfSeconds is None:
            return
        chosen = checkpoint_interval(save.blocked, config.mtbfSeconds, save.done - save.started)
        if (self.interval is None or abs(chosen.seconds - self.interval.seconds)
                > AUTO_INTERVAL_CHANGE * self.interval.seconds):
            self.interval, self.interval_seconds = chosen, chosen.seconds
            _say(self.out, chosen.line())

    def _state_names(self, save: PendingSave) -> bool:
        """Whether the checkpoint state file (what a restart restores) names `save` yet."""
        with self.goodput.timed("checkpoint_save"):
            state = tf.train.get_checkpoint_state(self.config.checkpointDir)
        return state is not None and \
            state.model_checkpoint_path.rsplit("/", 1)[-1] == save.path.rsplit("/", 1)[-1]

    def perf_meter(self, iterator) -> perf.PerfMeter:
        """The perf line's meter: the device alone against the executions (tpu_training.perf).
        MFU only on a TPU, against the slice's peak the resolved job carries."""
        config = self.config
        on_tpu = isinstance(self.strategy, tf.distribute.TPUStrategy)
        try:
            flops = train_flops_per_example(config)
        except KeyError:  # a model without a FLOPs figure in the job schema
            flops = None
        probe_seconds = min(perf.PROBE_SECONDS, config.max_execution_seconds or math.inf)
        return perf.PerfMeter(
            lambda line: _say(self.out, line), global_batch_size=config.globalBatchSize,
            max_probe_steps=config.stepsPerExecution,
            probe=perf.device_probe(
                self.strategy, self.train_step,
                [*self.model.variables, *self.optimizer.variables], iterator.element_spec),
            flops_per_example=flops, probe_seconds=probe_seconds,
            peak_flops_per_second=config.peakFlopsPerSecond if on_tpu else None)

    def replica_loss(self, *batch: tf.Tensor) -> tf.Tensor:
        """One replica's share of the batch's mean loss (a training pass of the model):
        the task's, so the perf probe times the same pass the steps run."""
        return self.task.loss(self.model, batch, self.config.globalBatchSize)

    def train_step(self, *batch: tf.Tensor) -> tf.Tensor:
        """One replica's training step on `batch` (the gradients all-reduced and applied by
        the optimizer); its share of the loss. The steps and the perf probe run this."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = self.replica_loss(*batch)
        gradients = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return loss

    def train_steps_fn(self) -> Callable:
        """`train_steps(iterator, num_steps)`: one execution of `num_steps` steps on device."""
        strategy, loss_metric, train_step = self.strategy, self.loss_metric, self.train_step

        def step_fn(*batch) -> None:
            loss_metric.update_state(train_step(*batch) * strategy.num_replicas_in_sync)

        @tf.function
        def train_steps(iterator, num_steps: tf.Tensor) -> None:
            for _ in tf.range(num_steps):
                strategy.run(step_fn, args=next(iterator))

        return train_steps

    def evaluate(self, dataset_fn: data.DatasetFn) -> dict[str, float]:
        """The task's metrics (accuracy and loss; BERT: also next-sentence accuracy) over
        one pass of the eval data, printed and summarised."""
        with self.strategy.scope():
            task_metrics = self.task.eval_metrics()

        def step_fn(*batch) -> None:
            self.task.eval_update(self.model, batch, task_metrics)

        @tf.function
        def eval_step(batch) -> None:
            self.strategy.run(step_fn, args=batch)

        batches, progress = 0, Throttle(EVAL_PROGRESS_SECONDS)
        for batch in self.strategy.distribute_datasets_from_function(dataset_fn):
            eval_step(batch)
            batches += 1
            if progress.due():  # a progress line for the agent's `final` deadline
                _say(self.out, f"eval_progress step={self.step} batch={batches}")
        if not batches:
            raise JobConfigError.single("evalData", f"holds fewer records than one global "
                                                    f"batch ({self.config.globalBatchSize})")
        metrics = self.task.eval_results(task_metrics)
        _say(self.out, " ".join(f"{name}={value:.6f}" for name, value in metrics.items()))
        with self.writer.as_default(step=self.step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)
        self.writer.flush()
        return metrics

    def _summarise(self, loss: float, steps_per_second: float) -> None:
        with self.writer.as_default(step=self.step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", self.optimizer.learning_rate)
            tf.summary.scalar("steps_per_second", steps_per_second)
            tf.summary.scalar("examples_per_second",
                              steps_per_second * self.config.globalBatchSize)

    def _export(self, *, evaluating: bool) -> None:
        """A float32 copy of the model, so serving needs no TPU and no bfloat16 kernels,
        then its marker (`evaluation: unfinished` until the evaluation's metrics replace it)."""
        # Layers keep the policy they were built with: the evaluation that follows runs
        # the model as it trained.
        keras.mixed_precision.set_global_policy("float32")
        if tf.io.gfile.exists(self.config.exportDir):
            # Replace, never merge: TF's ram:// filesystem appends to a file opened with "w".
            tf.io.gfile.rmtree(self.config.exportDir)
        self.task.export(self.model, self.config.exportDir)
        self._write_marker({"evaluation": "unfinished"} if evaluating else {})

    def _write_marker(self, results: dict[str, float | str]) -> None:
        marker = {"step": self.step, "model": self.spec.name, "trainSteps": self.config.trainSteps,
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **results}
        path = _join(self.config.exportDir, COMPLETE_MARKER)
        # ram:// appends to a file opened with "w"; elsewhere "w" replaces it whole (a
        # removal first would leave a window with no marker).
        if path.startswith("ram://") and tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
        with tf.io.gfile.GFile(path, "w") as out:
            json.dump(marker, out)


@dataclasses.dataclass
class PendingSave:
    """One save: when it began, how long training waited for it, when it was written."""

    step: int
    reason: str
    started: float
    path: str = ""
    blocked: float = 0.0
    done: float | None = None  # set by the writing thread once the files are written

    def written(self) -> None:
        self.done = time.monotonic()


class Throttle:
    """Due at the first call, then at most once every `seconds`."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.last: float | None = None

    def due(self) -> bool:
        now = self.clock()
        if self.last is not None and now - self.last < self.seconds:
            return False
        self.last = now
        return True


class ExecutionSizer:
    """Steps per execution, so that one execution fits `max_execution_seconds`.

    Without a notice every execution runs `stepsPerExecution` steps. With one, the
    first two run one step (the first is mostly compilation), then each runs as many as
    fit at the last measured seconds per step, at most twice the last. An execution
    never crosses a multiple of `checkpointEverySteps` or `trainSteps`.
    """

    def __init__(self, config: JobConfig):
        self.config = config
        self.budget = config.max_execution_seconds
        self.last_steps = 0
        self.seconds_per_step: float | None = None
        self.executions = 0

    def next_steps(self, step: int) -> int:
        config = self.config
        every = config.checkpointEverySteps
        most = min(config.stepsPerExecution, config.trainSteps - step, every - step % every)
        if self.budget is None:
            return most
        if self.seconds_per_step is None:
            return 1
        fits = int(self.budget / self.seconds_per_step)
        return max(1, min(most, fits, 2 * self.last_steps))

    def measured(self, steps: int, seconds: float) -> None:
        self.executions += 1
        self.last_steps = steps
        if self.executions > 1:  # the first execution's time is compilation
            self.seconds_per_step = seconds / steps


def checkpoint_bytes(path: str) -> int:
    """The size of the checkpoint `path` (its index and data shards), in bytes."""
    directory, prefix = path.rsplit("/", 1)
    # A listing, not a glob: a directory name may hold glob characters.
    return sum(tf.io.gfile.stat(f"{directory}/{name}").length
               for name in tf.io.gfile.listdir(directory) if name.startswith(f"{prefix}."))


def _summary(message: str, limit: int = 200) -> str:
    return message.strip().split("\n")[0][:limit]


def _dataset_fn(pattern: str, spec: models.ModelSpec, config: JobConfig,
                *, training: bool) -> data.DatasetFn:
    key = "trainData" if training else "evalData"
    files = data.list_files(pattern, key=key)
    data.check_records(files, spec, key=key, record_format=config.recordFormat)
    return data.make_dataset_fn(files, spec, config.globalBatchSize, training=training,
                                record_format=config.recordFormat,
                                index=data.RecordIndex(config.checkpointDir))


def _require_locations(config: JobConfig) -> None:
    missing = [(key, "is required to run a job") for key in LOCATION_KEYS
               if not getattr(config, key)]
    if missing:
        raise JobConfigError(missing)


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def _say(out: TextIO, line: str) -> None:
    output.say(line, out)


def restore_handlers(stop: StopFlag, out: TextIO) -> None:
    """Put back the job's SIGTERM, SIGUSR1 and SIGPIPE handlers where TensorFlow or
    libtpu replaced them (tpu_training.stopping, HandlerGuard), and say which."""
    replaced = stop.guard.restore()
    if replaced:
        _say(out, f"handlers_reinstalled signals={','.join(name for name, _ in replaced)} "
                  f"replaced_by={','.join(by for _, by in replaced)}")
