"""`python -m tpu_training`: one clear error per bad setting, exit codes, synth."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpu_training import data, models, synth
from tpu_training.__main__ import main
from tpu_training.config import JobConfig, JobConfigError
from tpu_training.tf_env import tf


def run_cli(capsys, *argv: str) -> tuple[int, str, list[str]]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def run_job(capsys, job_file, **overrides) -> tuple[int, list[str]]:
    code, _, errors = run_cli(capsys, "run", "--config", str(job_file(**overrides)))
    return code, errors


def test_unknown_model_is_one_usage_error(capsys, job_file):
    assert run_job(capsys, job_file, model="vgg16") == (2, [
        "tpu_training: error: model: 'vgg16' is not a known model; allowed: "
        "mnist_cnn, resnet18, resnet50, bert_tiny, bert_mini, bert_small, bert_medium, "
        "bert_base, bert_large"])


def test_missing_data_waits_for_data_exit_66(capsys, job_file, tmp_path):
    """Data uploaded after `pulumi up` is not there yet: transient, the agent waits for it."""
    pattern = f"{tmp_path}/nothing/train-*.tfrecord"
    code, out, errors = run_cli(capsys, "run", "--config", str(job_file(trainData=pattern)))
    assert (code, errors) == (66, [f"tpu_training: error: trainData: no files match {pattern!r}"])
    assert f"tpu_training waiting_for_data pattern={pattern}" in out.splitlines()


def test_missing_eval_data_is_named_as_such(capsys, job_file, tmp_path):
    pattern = f"{tmp_path}/nothing/eval-*.tfrecord"
    code, out, errors = run_cli(capsys, "run", "--config", str(job_file(evalData=pattern)))
    assert (code, errors) == (66, [f"tpu_training: error: evalData: no files match {pattern!r}"])
    assert f"tpu_training waiting_for_data pattern={pattern}" in out.splitlines()


@pytest.mark.parametrize(("pattern", "problem"), [
    ("/data/[train-*.tfrecord", "is not a valid glob: unbalanced [ ]"),
    ("s4://bucket/train-*.tfrecord", "the s4: scheme is not supported"),
])
def test_a_bad_glob_is_one_usage_error(capsys, job_file, pattern, problem):
    code, errors = run_job(capsys, job_file, trainData=pattern)
    assert code == 2
    assert len(errors) == 1
    assert errors[0].startswith("tpu_training: error: trainData: ")
    assert problem in errors[0]


def test_a_batch_not_divisible_by_the_replicas_is_one_usage_error(capsys, job_file, strategy):
    assert run_job(capsys, job_file, globalBatchSize=15) == (2, [
        "tpu_training: error: globalBatchSize: 15 is not divisible by the 2 replicas of this "
        "strategy; use a multiple of 2"])


def test_records_of_another_model_are_a_data_error_exit_65(capsys, job_file, mnist_data):
    code, errors = run_job(capsys, job_file, model="resnet18", imageSize=32, numClasses=10)
    assert code == 65
    assert errors == [f"tpu_training: error: trainData: records in {data.list_files(mnist_data)[0]}"
                      " hold 784-byte images; resnet18 reads 32x32x3 = 3072 bytes (see imageSize)"]


def test_files_that_are_not_tfrecords_are_a_data_error_exit_65(capsys, job_file, tmp_path):
    (tmp_path / "train-0.tfrecord").write_text("not a record")
    code, errors = run_job(capsys, job_file, trainData=f"{tmp_path}/train-*.tfrecord")
    assert code == 65
    assert len(errors) == 1
    assert "trainData: " in errors[0] and "is not a TFRecord file" in errors[0]


def test_every_config_problem_is_listed(capsys, job_file):
    code, errors = run_job(capsys, job_file, trainSteps=0, colour="red")
    assert code == 2
    assert errors[0].startswith("tpu_training: error: colour: unknown key; allowed: ")
    assert errors[1:] == []  # type problems first; values are checked once types are right
    code, errors = run_job(capsys, job_file, trainSteps=0, numClasses=0)
    assert errors == ["tpu_training: error: trainSteps: must be at least 1, got 0",
                      "tpu_training: error: numClasses: must be at least 1, got 0"]


def test_an_unreadable_config_file(capsys, tmp_path):
    missing = tmp_path / "missing.json"
    assert run_cli(capsys, "run", "--config", str(missing))[::2] == (2, [
        f"tpu_training: error: --config: cannot read {missing}: No such file or directory"])
    broken = tmp_path / "broken.json"
    broken.write_text("{model: mnist_cnn")
    code, _, errors = run_cli(capsys, "run", "--config", str(broken))
    assert code == 2
    assert errors[0].startswith(f"tpu_training: error: --config: {broken} is not valid JSON")


def test_an_unknown_strategy_is_one_usage_error(capsys, job_file, monkeypatch):
    monkeypatch.setenv("TPU_STACK_STRATEGY", "gpu")
    assert run_job(capsys, job_file) == (2, [
        "tpu_training: error: TPU_STACK_STRATEGY: 'gpu' is not allowed; use one of auto, tpu, cpu"])


def test_forced_tpu_without_one_retries_then_exits_69_in_one_line(job_file):
    """As the agent runs it: TPU_STACK_STRATEGY=tpu never falls back to the CPU; the job
    retries initialisation with backoff for its bounded time, then exits 69 (transient)."""
    env = {**os.environ, "TPU_STACK_STRATEGY": "tpu", "TPU_STACK_TPU_INIT_SECONDS": "3"}
    done = subprocess.run([sys.executable, "-m", "tpu_training", "run", "--config",
                           str(job_file())], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 69
    failure = "tpu_training: error: TPU 'local' did not initialise: NotFoundError: TPUs not " \
              "found in the cluster"
    lines = [line for line in done.stderr.splitlines() if line.startswith("tpu_training")]
    assert lines[-1] == f"{failure} (retried for 3 s)"
    retries = [line.rsplit("; ", 1)[1] for line in lines[:-1]]
    assert retries[0] == "retrying in 2.0 s"  # the backoff itself: test_strategy.py
    assert "Traceback" not in done.stderr
    assert "tpu_training step=" not in done.stdout
    # Initialisation time is accounted, and printed at exit.
    (goodput,) = [line for line in done.stdout.splitlines() if " goodput " in line]
    assert float(goodput.split("tpu_init=")[1].split()[0]) >= 3


def test_synth_writes_sharded_learnable_records(capsys, tmp_path):
    code, out, errors = run_cli(capsys, "synth", "--model", "resnet18", "--out", str(tmp_path),
                                "--examples", "40", "--shards", "4", "--image-size", "32",
                                "--num-classes", "5")
    assert (code, errors) == (0, [])
    assert out == (f"tpu_training synth wrote 40 examples in 4 shards: "
                   f"{tmp_path}/train-*.tfrecord\n")
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == [f"train-0000{i}-of-00004.tfrecord" for i in range(4)]
    spec = models.ModelSpec("resnet18", (32, 32, 3), 5, 0.1)
    records = tf.data.TFRecordDataset(data.list_files(f"{tmp_path}/train-*")).batch(40)
    images, labels = data.parse_batch(next(iter(records)), spec)
    assert images.shape == (40, 32, 32, 3) and set(labels.numpy()) <= set(range(5))
    # Learnable: each image is nearer its own class's mean image than any other's.
    images, labels = images.numpy().reshape(40, -1), labels.numpy()
    means = {label: images[labels == label].mean(axis=0) for label in set(labels)}
    nearest = [min(means, key=lambda c: ((image - means[c]) ** 2).sum()) for image in images]
    assert nearest == list(labels)


def test_synth_is_reproducible(tmp_path):
    spec = models.model_spec(JobConfig("mnist_cnn", "x", 8, 8))
    first = synth.write_dataset(str(tmp_path / "a"), spec, examples=32, shards=2, seed=3)
    second = synth.write_dataset(str(tmp_path / "b"), spec, examples=32, shards=2, seed=3)
    for a, b in zip(first.files, second.files, strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()


def test_synth_names_its_flags(capsys, tmp_path):
    code, _, errors = run_cli(capsys, "synth", "--model", "mnist_cnn", "--out", str(tmp_path),
                              "--image-size", "64")
    assert (code, errors) == (2, ["tpu_training: error: --image-size: applies to resnet models, "
                                  "not mnist_cnn (28x28)"])


def test_synth_needs_a_record_per_shard(capsys, tmp_path):
    code, _, errors = run_cli(capsys, "synth", "--model", "mnist_cnn", "--out", str(tmp_path),
                              "--examples", "3", "--shards", "4")
    assert (code, errors) == (2, ["tpu_training: error: --examples: 3 is fewer than --shards (4); "
                                  "every shard needs a record"])


def test_job_config_error_lists_every_problem():
    assert isinstance(JobConfigError.single("k", "m"), ValueError)
    assert str(JobConfigError([("a", "x"), ("b", "y")])) == "a: x; b: y"


def test_a_failed_stop_save_exits_76_in_one_line(capsys, job_file, monkeypatch):
    from tpu_training import exits, train

    def stop_save_failed(config, **_):
        raise exits.StopSaveError("stopped by signal 15 at step 40 but the stop save failed: "
                                  "UnavailableError: Socket closed")

    monkeypatch.setattr(train, "run", stop_save_failed)
    assert run_job(capsys, job_file) == (76, [
        "tpu_training: error: stopped by signal 15 at step 40 but the stop save failed: "
        "UnavailableError: Socket closed"])


def test_storage_unavailable_exits_69_in_one_line(capsys, job_file, monkeypatch):
    from tpu_training import train

    def storage_down(config, **_):
        raise tf.errors.UnavailableError(
            None, None, "Error executing an HTTP request: HTTP response code 503")

    monkeypatch.setattr(train, "run", storage_down)
    assert run_job(capsys, job_file) == (69, [
        "tpu_training: error: storage unavailable: Error executing an HTTP request: HTTP "
        "response code 503"])


def test_a_tpu_held_by_another_process_exits_69_at_once_naming_the_holders(capsys, job_file,
                                                                            monkeypatch):
    from tpu_training import strategy, train

    def held(config, **_):
        raise strategy.TpuBusyError("TPU 'local' did not initialise: AbortedError: held", (7, 9))

    monkeypatch.setattr(train, "run", held)
    code, out, errors = run_cli(capsys, "run", "--config", str(job_file()))
    started = "tpu_training started stacks=SIGUSR1 tpu_init_seconds=300\n"
    assert (code, out) == (69, f"{started}tpu_training tpu_busy holders=7,9\n")
    assert errors == ["tpu_training: error: TPU 'local' did not initialise: AbortedError: held"]
