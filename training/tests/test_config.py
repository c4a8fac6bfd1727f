"""The job schema's rules; standard library only, so it also runs in the infra venv."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tpu_training.config import LOCATION_KEYS, MODEL_NAMES, JobConfig, JobConfigError

STACK_JOB = {"model": "mnist_cnn", "trainData": "datasets/mnist/train-*.tfrecord",
             "globalBatchSize": 1024, "trainSteps": 5000, "stepsPerExecution": 100,
             "checkpointEverySteps": 500}
LOCATIONS = {"checkpointDir": "gs://b/ckpt/n/", "exportDir": "gs://b/export/n/",
             "tensorboardDir": "gs://b/tb/n/"}


def problems_of(data: dict, *, resolved: bool = False) -> dict[str, str]:
    with pytest.raises(JobConfigError) as caught:
        JobConfig.from_dict(data, resolved=resolved)
    return dict(caught.value.problems)


def test_stack_job_round_trips_and_resolves_for_a_node():
    job = JobConfig.from_dict(STACK_JOB, resolved=False)
    assert {k: v for k, v in job.to_dict().items() if v is not None} == {
        **STACK_JOB, "recordFormat": "raw", "checkpointEveryMinutes": 1.0}
    node = job.resolve(data_root="gs://acme-data/", checkpoint_dir="gs://c/ckpt/n/",
                       export_dir="gs://c/export/n/", tensorboard_dir="gs://c/tb/n/")
    assert node.trainData == "gs://acme-data/datasets/mnist/train-*.tfrecord"
    assert (node.checkpointDir, node.exportDir, node.tensorboardDir) == (
        "gs://c/ckpt/n/", "gs://c/export/n/", "gs://c/tb/n/")
    assert JobConfig.from_dict(node.to_dict(), resolved=True) == node


@pytest.mark.parametrize("path", ["gs://other/x-*.tfrecord", "/data/x-*"])
def test_absolute_data_is_kept_when_resolving(path):
    job = JobConfig.from_dict({**STACK_JOB, "trainData": path}, resolved=False)
    assert job.resolve(data_root="gs://root", checkpoint_dir="c", export_dir="e",
                       tensorboard_dir="t").trainData == path


def test_a_stack_job_reads_only_gs_but_a_resolved_one_may_read_local_test_schemes():
    with pytest.raises(JobConfigError, match="trainData: 'ram://x/\\*': the ram: scheme"):
        JobConfig.from_dict({**STACK_JOB, "trainData": "ram://x/*"}, resolved=False)
    resolved = {**STACK_JOB, "trainData": "ram://x/*", "checkpointDir": "/tmp/c",
                "exportDir": "ram://e", "tensorboardDir": "gs://t/"}
    assert JobConfig.from_dict(resolved).trainData == "ram://x/*"
    with pytest.raises(JobConfigError, match="checkpointDir: 's3://c': the s3: scheme"):
        JobConfig.from_dict({**resolved, "checkpointDir": "s3://c"})


def test_none_means_the_default():
    job = JobConfig.from_dict({**STACK_JOB, "stepsPerExecution": None,
                               "checkpointEverySteps": None, "trainSteps": 2000},
                              resolved=False)
    assert (job.stepsPerExecution, job.checkpointEverySteps) == (100, 1000)


def test_every_problem_is_reported_at_once_each_naming_its_key():
    problems = problems_of({"model": "mnist_cnn", "globalBatchSize": "8", "colour": "red"})
    assert set(problems) == {"colour", "trainData", "trainSteps", "globalBatchSize"}
    assert "unknown key; allowed: " in problems["colour"]
    assert "globalBatchSize" in problems["colour"]
    assert problems["trainData"] == "is required"
    assert problems["globalBatchSize"] == "must be a whole number, got '8'"


def test_the_error_message_names_each_key():
    with pytest.raises(JobConfigError, match=r"^model: 'gpt' is not a known model; allowed: "
                                             r"mnist_cnn, resnet18, resnet50, bert_tiny, "
                                             r"bert_mini, bert_small, bert_medium, bert_base, "
                                             r"bert_large$"):
        JobConfig.from_dict({**STACK_JOB, "model": "gpt"}, resolved=False)


def test_a_non_mapping_is_rejected():
    assert problems_of(["model"]) == {"": "must be a mapping of job settings, got list"}


@pytest.mark.parametrize("key", ["globalBatchSize", "trainSteps", "stepsPerExecution",
                                 "checkpointEverySteps", "warmupSteps", "imageSize",
                                 "numClasses"])
@pytest.mark.parametrize("value", [True, 2.5, "4"])
def test_whole_numbers(key, value):
    assert problems_of({**STACK_JOB, key: value})[key] == f"must be a whole number, got {value!r}"


@pytest.mark.parametrize("key", ["learningRate", "widthMultiplier", "checkpointEveryMinutes"])
@pytest.mark.parametrize("value", [False, "0.1"])
def test_numbers(key, value):
    assert problems_of({**STACK_JOB, key: value})[key] == f"must be a number, got {value!r}"


@pytest.mark.parametrize("key", ["model", "trainData", "evalData"])
@pytest.mark.parametrize("value", ["", 3])
def test_strings(key, value):
    assert problems_of({**STACK_JOB, key: value})[key] == (
        f"must be a non-empty string, got {value!r}")


@pytest.mark.parametrize("key", ["globalBatchSize", "trainSteps", "stepsPerExecution",
                                 "checkpointEverySteps", "numClasses"])
def test_counts_are_positive(key):
    assert problems_of({**STACK_JOB, key: 0})[key] == "must be at least 1, got 0"


def test_unknown_model_lists_the_known_ones():
    message = problems_of({**STACK_JOB, "model": "resnet101"})["model"]
    assert message == f"'resnet101' is not a known model; allowed: {', '.join(MODEL_NAMES)}"


@pytest.mark.parametrize(("rate", "ok"), [(0.1, True), (9.9, True), (0, False), (10, False),
                                          (-1, False), (math.nan, False)])
def test_learning_rate_range(rate, ok):
    data = {**STACK_JOB, "learningRate": rate}
    if ok:
        assert JobConfig.from_dict(data, resolved=False).learningRate == rate
    else:
        assert problems_of(data)["learningRate"].startswith("must be between 0 and 10")


@pytest.mark.parametrize(("width", "ok"), [(0.125, True), (4, True), (0, False), (4.5, False),
                                           (math.inf, False)])
def test_width_multiplier_range(width, ok):
    data = {**STACK_JOB, "widthMultiplier": width}
    if ok:
        assert JobConfig.from_dict(data, resolved=False).widthMultiplier == width
    else:
        assert problems_of(data)["widthMultiplier"] == f"must be in (0, 4], got {width}"


def test_warmup_steps():
    assert problems_of({**STACK_JOB, "warmupSteps": -1})["warmupSteps"] == (
        "must be 0 or more, got -1")
    assert problems_of({**STACK_JOB, "warmupSteps": 5001})["warmupSteps"] == (
        "5001 is more than trainSteps (5000)")
    assert JobConfig.from_dict({**STACK_JOB, "warmupSteps": 0}, resolved=False).warmupSteps == 0


def test_image_size():
    assert problems_of({**STACK_JOB, "imageSize": 64})["imageSize"] == (
        "applies to resnet models, not mnist_cnn (28x28)")
    resnet = {**STACK_JOB, "model": "resnet50"}
    assert problems_of({**resnet, "imageSize": 16})["imageSize"] == "must be at least 32, got 16"
    assert JobConfig.from_dict({**resnet, "imageSize": 32}, resolved=False).imageSize == 32


def test_record_format_defaults_to_raw_and_imagenet_is_for_resnets():
    assert JobConfig.from_dict(STACK_JOB, resolved=False).recordFormat == "raw"
    resnet = {**STACK_JOB, "model": "resnet18", "recordFormat": "imagenet"}
    assert JobConfig.from_dict(resnet, resolved=False).recordFormat == "imagenet"
    assert problems_of({**STACK_JOB, "recordFormat": "imagenet"}) == {
        "recordFormat": "imagenet records are RGB photos for resnet18, resnet50; mnist_cnn "
                        "reads raw records only"}
    assert problems_of({**resnet, "recordFormat": "png"}) == {
        "recordFormat": "'png' is not a record format; allowed: raw, imagenet, "
                        "bert_pretraining"}
    assert problems_of({**resnet, "recordFormat": 1}) == {
        "recordFormat": "must be a non-empty string, got 1"}


def test_steps_per_execution_fits_in_train_steps():
    problems = problems_of({**STACK_JOB, "trainSteps": 50})
    assert problems == {"stepsPerExecution": "100 is more than trainSteps (50)"}


def test_checkpoints_fall_between_executions():
    problems = problems_of({**STACK_JOB, "checkpointEverySteps": 250})
    assert problems == {"checkpointEverySteps": "250 is not a multiple of stepsPerExecution (100)"}


def test_a_resolved_job_needs_every_location():
    problems = problems_of({**STACK_JOB, "exportDir": "gs://b/e/"}, resolved=True)
    assert problems == {"checkpointDir": "is required in a resolved job config",
                        "tensorboardDir": "is required in a resolved job config"}
    assert JobConfig.from_dict({**STACK_JOB, **LOCATIONS}).exportDir == "gs://b/export/n/"


@pytest.mark.parametrize(("minutes", "ok"), [(5, True), (0.5, True), (0, False), (-1, False),
                                             (math.inf, False), (math.nan, False)])
def test_checkpoint_every_minutes_is_a_positive_time(minutes, ok):
    data = {**STACK_JOB, "checkpointEveryMinutes": minutes}
    if ok:
        assert JobConfig.from_dict(data, resolved=False).checkpointEveryMinutes == minutes
    else:
        assert problems_of(data)["checkpointEveryMinutes"] == (
            f"must be a number of minutes more than 0, got {minutes}")


def test_a_checkpoint_every_minute_by_default():
    """A kill loses about half an interval: 1 minute keeps a kill per 30 minutes under 3%."""
    assert JobConfig.from_dict(STACK_JOB, resolved=False).checkpointEveryMinutes == 1.0


def test_a_stack_job_has_no_locations():
    problems = problems_of({**STACK_JOB, **LOCATIONS}, resolved=False)
    assert set(problems) == set(LOCATION_KEYS)
    assert all(message.startswith("unknown key") for message in problems.values())


def test_importing_the_package_and_schema_does_not_import_tensorflow():
    code = ("import sys, tpu_training, tpu_training.config, tpu_training.stopping, "
            "tpu_training.exits, tpu_training.goodput\n"
            "sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_node_notice_is_set_on_resolve_and_bounds_an_execution():
    job = JobConfig.from_dict(STACK_JOB, resolved=False)
    node = job.resolve(data_root="gs://d", checkpoint_dir="gs://c/ckpt/n/",
                       export_dir="gs://c/export/n/", tensorboard_dir="gs://c/tb/n/",
                       notice_seconds=30)
    assert node.noticeSeconds == 30
    assert node.max_execution_seconds == 7.5  # a quarter of the notice
    assert JobConfig.from_dict(node.to_dict(), resolved=True) == node
    unbounded = job.resolve(data_root="gs://d", checkpoint_dir="c", export_dir="e",
                            tensorboard_dir="t")
    assert unbounded.noticeSeconds is unbounded.max_execution_seconds is None


def test_the_notice_is_the_nodes_not_the_stack_jobs():
    assert "unknown key" in problems_of({**STACK_JOB, "noticeSeconds": 30})["noticeSeconds"]
    assert problems_of({**STACK_JOB, **LOCATIONS, "noticeSeconds": 0}, resolved=True) == {
        "noticeSeconds": "must be a number of seconds more than 0, got 0"}


@pytest.mark.parametrize("seconds", [10, 90.5, 120])
def test_progress_deadline_is_a_number_of_seconds_from_ten_to_120(seconds):
    job = JobConfig.from_dict({**STACK_JOB, "progressDeadlineSeconds": seconds}, resolved=False)
    assert job.progressDeadlineSeconds == seconds
    node = job.resolve(data_root="gs://d/", checkpoint_dir="gs://c/", export_dir="gs://e/",
                       tensorboard_dir="gs://t/", notice_seconds=30)
    assert node.progressDeadlineSeconds == seconds  # the node's agent reads it


BOUNDS = ("must be a number of seconds from 10 to 120 (it also bounds the stop, which must "
          "end inside the node's systemd stop timeout; leave it unset for the agent's "
          "defaults)")


@pytest.mark.parametrize(("seconds", "message"), [
    (9.5, f"{BOUNDS}, got 9.5"),
    (120.5, f"{BOUNDS}, got 120.5"),
    (math.inf, f"{BOUNDS}, got inf"),
    ("60", "must be a number, got '60'"),
])
def test_a_bad_progress_deadline_is_named(seconds, message):
    data = {**STACK_JOB, "progressDeadlineSeconds": seconds}
    assert problems_of(data) == {"progressDeadlineSeconds": message}


def test_goodput_recording_is_true_or_false_and_kept_only_when_set():
    assert problems_of({**STACK_JOB, "goodputRecording": "yes"}) == {
        "goodputRecording": "must be true or false, got 'yes'"}
    on = JobConfig.from_dict({**STACK_JOB, "goodputRecording": True}, resolved=False)
    assert on.to_dict()["goodputRecording"] is True
    assert "goodputRecording" not in JobConfig.from_dict(STACK_JOB, resolved=False).to_dict()
