"""The job in-process on two CPU replicas: it learns, logs, checkpoints and exports."""

from __future__ import annotations

import io
import itertools
import re
import time

import numpy as np
import pytest

from tpu_training import data, exits, models, train
from tpu_training.config import JobConfig, JobConfigError
from tpu_training.goodput import CATEGORIES
from tpu_training.stopping import StopFlag
from tpu_training.tf_env import keras, tf

SAVED_LINE = re.compile(r"tpu_training saved step=(\d+) seconds=(\d+\.\d{3}) bytes=(\d+) "
                        r"reason=(steps|minutes|stop|final) blocked=(\d+\.\d{3})")
GOODPUT_LINE = re.compile(r"tpu_training goodput step=(\d+) " + " ".join(
    rf"{name}=(?P<{name}>\d+\.\d{{3}})" for name in CATEGORIES))


def progress(lines: list[str]) -> list[str]:
    """The lines of the job's progress, without its accounting (saved, goodput, perf)
    and the phase markers before training (tpu_ready, recipe)."""
    return [line for line in lines if not line.startswith(("tpu_training saved ",
                                                           "tpu_training goodput ",
                                                           "tpu_training perf ",
                                                           "tpu_training eval_progress ",
                                                           "tpu_training tpu_ready ",
                                                           "tpu_training recipe "))]


def goodput_of(line: str) -> dict[str, float]:
    match = GOODPUT_LINE.fullmatch(line)
    assert match, line
    return {name: float(match[name]) for name in CATEGORIES}


@pytest.fixture(scope="module")
def finished(strategy, make_job):
    """One finished 60-step job, every location on TF's in-memory filesystem."""
    job = make_job("ram://finished")
    config = JobConfig.from_dict({**job, "evalData": job["trainData"]})
    out = io.StringIO()
    result = train.run(config, strategy=strategy, out=out)
    return config, result, out.getvalue().splitlines()


def test_loss_falls(finished):
    _, result, _ = finished
    assert result.outcome is train.Outcome.FINISHED
    assert len(result.losses) == 12  # 60 steps, 5 per execution
    assert result.losses[0] > 2.0  # about ln(10): chance on 10 classes
    assert np.mean(result.losses[-2:]) < 0.6 * result.losses[0]


def test_progress_lines_one_per_execution(finished):
    config, _, lines = finished
    lines = progress(lines)
    assert lines[0] == "tpu_training resumed_from=0"
    assert re.fullmatch(r"tpu_training eval_accuracy=\d\.\d{6} eval_loss=\d+\.\d{6}", lines[-2])
    assert lines[-1] == f"tpu_training complete=60 export={config.exportDir}"
    steps = [re.fullmatch(r"tpu_training step=(\d+) loss=(\d+\.\d+)", line) for line in lines[1:-2]]
    assert all(steps), lines
    assert [int(match[1]) for match in steps] == list(range(5, 61, 5))


def test_checkpoints_every_interval_and_at_the_end(finished):
    config, _, _ = finished
    state = tf.train.get_checkpoint_state(config.checkpointDir)
    assert [path.rsplit("-", 1)[1] for path in state.all_model_checkpoint_paths] == [
        "20", "40", "60"]
    # Not tf.train.load_checkpoint: on ram:// every path looks like a directory to it.
    reader = tf.compat.v1.train.NewCheckpointReader(state.model_checkpoint_path)
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 60


def test_tensorboard_gets_loss_and_learning_rate_per_execution(finished):
    config, _, _ = finished
    (events,) = tf.io.gfile.glob(f"{config.tensorboardDir}/events.out.tfevents.*")
    steps: dict[str, list[int]] = {}
    for record in tf.data.TFRecordDataset(events):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
            steps.setdefault(value.tag, []).append(event.step)
    assert steps["loss"] == list(range(5, 61, 5))
    assert steps["learning_rate"] == steps["loss"]
    assert {"steps_per_second", "examples_per_second"} <= set(steps)
    assert steps["eval_accuracy"] == steps["eval_loss"] == [60]


def test_exported_model_loads_and_predicts(finished, mnist_data):
    config, _, _ = finished
    serve = tf.saved_model.load(config.exportDir).signatures["serving_default"]
    spec = models.model_spec(config)
    records = tf.data.TFRecordDataset(data.list_files(mnist_data)).batch(256)
    images, labels = data.parse_batch(next(iter(records)), spec)
    predicted = serve(images=images)
    assert predicted["probabilities"].shape == (256, 10)
    np.testing.assert_allclose(tf.reduce_sum(predicted["probabilities"], axis=1), 1, rtol=1e-5)
    accuracy = np.mean(predicted["classes"].numpy() == labels.numpy())
    assert accuracy > 0.5  # chance is 0.1


def test_evaluation_at_the_end_is_reported_and_kept_in_the_marker(finished):
    config, _, lines = finished
    marker = train.read_marker(config.exportDir)
    assert progress(lines)[-2] == (f"tpu_training eval_accuracy={marker['eval_accuracy']:.6f} "
                         f"eval_loss={marker['eval_loss']:.6f}")
    assert "evaluation" not in marker  # the metrics replaced "unfinished"
    assert marker["eval_accuracy"] > 0.5  # chance is 0.1


def test_evaluation_says_how_far_it_got_from_its_first_batch(finished):
    _, _, lines = finished
    said = [line for line in lines if line.startswith("tpu_training eval_progress ")]
    assert said and said[0] == "tpu_training eval_progress step=60 batch=1"
    batches = [int(line.rsplit("=", 1)[1]) for line in said]
    assert batches == sorted(set(batches))  # at most every 10 s: one for a quick evaluation
    last_step = lines.index(next(line for line in lines
                                 if line.startswith("tpu_training step=60 ")))
    evaluated = lines.index(next(line for line in lines if " eval_accuracy=" in line))
    assert last_step < lines.index(said[0]) < lines.index(said[-1]) + 1 <= evaluated


def test_the_evaluation_progress_throttle_is_due_first_then_every_ten_seconds():
    now = [100.0]
    throttle = train.Throttle(train.EVAL_PROGRESS_SECONDS, clock=lambda: now[0])
    due = []
    for _ in range(25):
        due.append(throttle.due())
        now[0] += 1.0
    assert [i for i, d in enumerate(due) if d] == [0, 10, 20]


def test_a_run_resuming_at_train_steps_with_its_export_does_not_evaluate_again(
        strategy, job, mnist_data, monkeypatch):
    """A run stopped (or hung) during its evaluation: the next one ends at once (finding 7)."""
    config = JobConfig.from_dict(job(trainSteps=20, checkpointEverySteps=20, evalData=mnist_data))

    class HungError(Exception):
        """The agent stopping a job stuck in its evaluation."""

    def hang(self, dataset_fn):
        raise HungError

    monkeypatch.setattr(train.Job, "evaluate", hang)
    with pytest.raises(HungError):
        train.run(config, strategy=strategy, out=io.StringIO())
    evaluations = []
    monkeypatch.setattr(train.Job, "evaluate", lambda self, fn: evaluations.append(fn) or {})
    out = io.StringIO()
    result = train.run(config, strategy=strategy, out=out)
    assert evaluations == []
    assert (result.outcome, result.step) == (train.Outcome.ALREADY_COMPLETE, 20)
    assert out.getvalue().splitlines()[0] == f"tpu_training complete=20 export={config.exportDir}"
    assert train.read_marker(config.exportDir)["evaluation"] == "unfinished"
    assert tf.saved_model.load(config.exportDir).signatures["serving_default"] is not None


def test_a_finished_job_reruns_as_a_no_op(finished):
    config, _, _ = finished
    out = io.StringIO()
    result = train.run(config, strategy=None, out=out)  # no strategy: it must not need one
    assert (result.outcome, result.step, result.losses) == (
        train.Outcome.ALREADY_COMPLETE, 60, ())
    complete, goodput = out.getvalue().splitlines()
    assert complete == f"tpu_training complete=60 export={config.exportDir}"
    assert goodput.startswith("tpu_training goodput step=60 productive=0.000 ")


def test_more_train_steps_continue_a_finished_job(finished, strategy):
    config, _, _ = finished
    out = io.StringIO()
    longer = JobConfig.from_dict({**config.to_dict(), "trainSteps": 70})
    result = train.run(longer, strategy=strategy, out=out)
    assert (result.outcome, result.resumed_from, result.step) == (train.Outcome.FINISHED, 60, 70)
    assert train.read_marker(config.exportDir)["step"] == 70


def test_learning_rate_scales_with_the_global_batch_and_warms_up():
    config = JobConfig.from_dict({"model": "resnet18", "trainData": "x", "globalBatchSize": 512,
                                  "trainSteps": 110, "stepsPerExecution": 10,
                                  "checkpointEverySteps": 10, "learningRate": 0.1,
                                  "warmupSteps": 10}, resolved=False)
    schedule = train.learning_rate(config, models.model_spec(config))
    rates = {step: float(schedule(step)) for step in (0, 4, 9, 59, 109)}
    assert rates == pytest.approx({0: 0.02, 4: 0.1, 9: 0.2, 59: 0.1, 109: 0.0}, abs=1e-6)


def test_default_warmup_is_a_tenth_of_training_up_to_1000_steps():
    base = {"model": "mnist_cnn", "trainData": "x", "globalBatchSize": 256,
            "stepsPerExecution": 10, "checkpointEverySteps": 10}
    for steps, warmup in ((200, 20), (50_000, 1000)):
        config = JobConfig.from_dict({**base, "trainSteps": steps}, resolved=False)
        assert train.learning_rate(config, models.model_spec(config)).warmup_steps == warmup


def test_bfloat16_trunk_with_a_float32_output():
    spec = models.ModelSpec("resnet18", (32, 32, 3), 10, 0.1, width=0.125)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = models.build_model(spec)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    convolutions = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert {layer.compute_dtype for layer in convolutions} == {"bfloat16"}
    assert {layer.variable_dtype for layer in convolutions} == {"float32"}
    assert model.output.dtype == tf.float32


@pytest.mark.parametrize(("name", "trainable"), [("resnet18", 11_689_512),
                                                 ("resnet50", 25_557_032)])
def test_resnets_have_the_published_sizes(name, trainable):
    """torchvision's ImageNet ResNet-18/50 parameter counts (pytorch.org/vision)."""
    model = models.build_model(models.ModelSpec(name, (224, 224, 3), 1000, 0.1))
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == trainable
    assert model.output.shape == (None, 1000)


def test_the_tpu_precision_path_trains_and_exports_float32(strategy, job, monkeypatch):
    """mixed_bfloat16 as on a TPU, run on the CPU replicas (oneDNN has bfloat16 kernels)."""
    monkeypatch.setattr(train, "precision_policy", lambda _strategy: "mixed_bfloat16")
    config = JobConfig.from_dict(job(trainSteps=10))
    result = train.run(config, strategy=strategy, out=io.StringIO())
    assert result.outcome is train.Outcome.FINISHED
    assert all(np.isfinite(result.losses))
    assert keras.mixed_precision.global_policy().name == "float32"  # restored for serving
    serve = tf.saved_model.load(config.exportDir).signatures["serving_default"]
    predicted = serve(images=tf.zeros([2, 28, 28, 1]))
    assert predicted["probabilities"].dtype == tf.float32


def test_a_checkpoint_of_another_model_is_one_clear_error(finished, strategy):
    config, _, _ = finished
    wider = JobConfig.from_dict({**config.to_dict(), "widthMultiplier": 0.25,
                                 "exportDir": "ram://wider/export"})
    with pytest.raises(JobConfigError) as caught:
        train.run(wider, strategy=strategy, out=io.StringIO())
    ((key, message),) = caught.value.problems
    assert key == "checkpointDir"
    assert re.match(f"{config.checkpointDir}/ckpt-\\d+ is not a checkpoint of this mnist_cnn job: ",
                    message)


def test_every_save_prints_its_step_seconds_bytes_and_reason(finished):
    config, _, lines = finished
    saves = [SAVED_LINE.fullmatch(line) for line in lines if " saved " in line]
    assert [(int(m[1]), m[4]) for m in saves] == [(20, "steps"), (40, "steps"), (60, "steps")]
    assert all(float(m[2]) > 0 for m in saves)
    last = f"{config.checkpointDir}/ckpt-60"
    assert int(saves[-1][3]) == train.checkpoint_bytes(last) > 100_000  # the 1/8 MNIST CNN


def test_goodput_after_every_step_and_save_and_at_exit(finished):
    _, _, lines = finished
    for line, after in itertools.pairwise(lines):
        if line.startswith(("tpu_training step=", "tpu_training saved ")):
            assert after.startswith("tpu_training goodput step="), (line, after)
    totals = [goodput_of(line) for line in lines if " goodput " in line]
    assert lines[-1].startswith("tpu_training goodput step=60 ")
    for earlier, later in itertools.pairwise(totals):  # cumulative
        assert all(later[name] >= earlier[name] for name in CATEGORIES)
    last = totals[-1]
    # Training waited only for the blocked part of an asynchronous save.
    blocked = sum(float(SAVED_LINE.fullmatch(line)[5]) for line in lines if " saved " in line)
    assert last["checkpoint_save"] >= blocked  # the saves, and the export
    assert last["productive"] > 0 and last["program_startup"] > 0
    assert last["tpu_init"] < 0.01  # the strategy was given: nothing to initialise
    # The first execution (tracing) is start-up: productive starts after it.
    first = next(i for i, line in enumerate(lines) if line.startswith("tpu_training step="))
    after_first = goodput_of(lines[first + 1])
    assert after_first["productive"] < after_first["program_startup"] / 10


def test_checkpoint_every_minutes_bounds_lost_work_in_time(strategy, job):
    config = JobConfig.from_dict(job(trainSteps=20, checkpointEverySteps=1000,
                                     checkpointEveryMinutes=1e-6))
    out = io.StringIO()
    train.run(config, strategy=strategy, out=out)
    saves = [SAVED_LINE.fullmatch(line) for line in out.getvalue().splitlines()]
    assert [(int(m[1]), m[4]) for m in saves if m] == [
        (5, "minutes"), (10, "minutes"), (15, "minutes"), (20, "minutes")]


def test_without_an_interval_due_the_last_save_is_final(strategy, job):
    config = JobConfig.from_dict(job(trainSteps=10, checkpointEverySteps=1000))
    out = io.StringIO()
    train.run(config, strategy=strategy, out=out)
    saves = [SAVED_LINE.fullmatch(line) for line in out.getvalue().splitlines()]
    assert [(int(m[1]), m[4]) for m in saves if m] == [(10, "final")]


def test_a_stop_save_that_fails_is_a_stop_save_error(strategy, job, monkeypatch):
    """On a pod the other hosts may go down before the stop save: exit 76, not failed."""
    def unavailable(self, checkpoint_number=None, options=None):
        raise tf.errors.UnavailableError(None, None, "Socket closed")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", unavailable)
    stop = StopFlag()
    stop.signal = 15  # arrived while the job started: it saves at once
    out = io.StringIO()
    with pytest.raises(exits.StopSaveError) as caught:
        train.run(JobConfig.from_dict(job()), strategy=strategy, stop=stop, out=out)
    assert str(caught.value) == ("stopped by signal 15 at step 0 but the stop save failed: "
                                 "UnavailableError: Socket closed")
    assert out.getvalue().splitlines()[-1].startswith("tpu_training goodput step=0 ")


def test_a_save_that_fails_without_a_stop_is_the_error_itself(strategy, job, monkeypatch):
    def unavailable(self, checkpoint_number=None, options=None):
        raise tf.errors.UnavailableError(None, None, "503 Service Unavailable")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", unavailable)
    with pytest.raises(tf.errors.UnavailableError):
        train.run(JobConfig.from_dict(job(trainSteps=20)), strategy=strategy, out=io.StringIO())


def test_checkpoint_bytes_are_the_files_of_that_checkpoint_only(tmp_path):
    directory = tmp_path / "node[0]"  # glob characters in a path are taken literally
    checkpoint = tf.train.Checkpoint(weights=tf.Variable(tf.zeros([1000])))
    manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=3)
    first, second = manager.save(checkpoint_number=1), manager.save(checkpoint_number=10)
    files = sorted(path.name for path in directory.iterdir() if path.name.startswith("ckpt-1."))
    assert files == ["ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    assert train.checkpoint_bytes(first) == sum((directory / f).stat().st_size for f in files)
    assert train.checkpoint_bytes(first) == train.checkpoint_bytes(second) > 4000


def steps_of(out: io.StringIO) -> list[int]:
    return [int(match[1]) for match in re.finditer(r"^tpu_training step=(\d+) ", out.getvalue(),
                                                   re.M)]


def test_a_notice_sizes_executions_from_the_measured_step_time(strategy, job):
    """One step, one measured step, then doubling up to what fits the notice, never past
    stepsPerExecution or a checkpoint interval. Without a notice: stepsPerExecution."""
    roomy = JobConfig.from_dict(job(trainSteps=60, stepsPerExecution=20, noticeSeconds=1e6))
    out = io.StringIO()
    train.run(roomy, strategy=strategy, out=out)
    assert steps_of(out) == [1, 2, 4, 8, 16, 20, 28, 40, 60]
    tight = JobConfig.from_dict(job(trainSteps=8, stepsPerExecution=4, checkpointEverySteps=4,
                                    noticeSeconds=1e-3, exportDir="ram://tight/export",
                                    checkpointDir="ram://tight/ckpt"))
    out = io.StringIO()
    train.run(tight, strategy=strategy, out=out)
    assert steps_of(out) == [1, 2, 3, 4, 5, 6, 7, 8]  # no step fits 0.25 ms: one at a time


def test_an_interval_save_does_not_wait_for_its_write(strategy, job, monkeypatch):
    """Training goes on while a save is written; its line follows once written, and a
    kill during the write leaves the previous checkpoint the latest."""
    config = JobConfig.from_dict(job(trainSteps=40, stepsPerExecution=5, checkpointEverySteps=20))
    options = []
    save = tf.train.CheckpointManager.save

    def recording(self, checkpoint_number=None, options_=None, **kwargs):
        options.append(kwargs.get("options", options_))
        return save(self, checkpoint_number=checkpoint_number, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", recording)
    out = io.StringIO()
    train.run(config, strategy=strategy, out=out)
    assert [o.experimental_enable_async_checkpoint for o in options] == [True, True]
    lines = out.getvalue().splitlines()
    saves = [SAVED_LINE.fullmatch(line) for line in lines if " saved " in line]
    assert [(int(m[1]), m[4]) for m in saves] == [(20, "steps"), (40, "steps")]
    assert all(float(m[5]) <= float(m[2]) for m in saves)  # blocked within the write
    assert tf.train.latest_checkpoint(config.checkpointDir).endswith("ckpt-40")


def test_a_saved_line_comes_once_the_checkpoint_state_names_its_step(strategy, job,
                                                                     monkeypatch):
    """TF runs the job's write callback before the manager's, which writes the state file
    a restart restores from: the `saved` line waits for the state (finding 8)."""
    config = JobConfig.from_dict(job(trainSteps=40, stepsPerExecution=5, checkpointEverySteps=20))
    record_state = tf.train.CheckpointManager._record_state

    def slow_record_state(self):  # a state file on a slow GCS
        time.sleep(1.0)
        record_state(self)

    monkeypatch.setattr(tf.train.CheckpointManager, "_record_state", slow_record_state)
    named: list[tuple[int, str | None]] = []

    class Out(io.StringIO):
        def write(self, text: str) -> int:
            if match := SAVED_LINE.match(text):
                state = tf.train.get_checkpoint_state(config.checkpointDir)
                named.append((int(match[1]), state and state.model_checkpoint_path))
            return super().write(text)

    train.run(config, strategy=strategy, out=Out())
    assert [step for step, _ in named] == [20, 40]
    assert all(path is not None and path.endswith(f"ckpt-{step}") for step, path in named), named
