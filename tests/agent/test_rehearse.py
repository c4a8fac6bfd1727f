"""`tpuctl rehearse` helpers: which metadata it serves and how it shrinks the job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node_agent import JOB_KEY, PACKAGE_SHA256_KEY, STARTUP_SCRIPT_KEY, startup_script
from ops.local.rehearse import (
    REHEARSAL_IMAGE_SIZE,
    REHEARSAL_WIDTH,
    RehearsalError,
    last_error_line,
    pick_node,
    planned_nodes,
    rehearsal_job,
    write_datasets,
)
from ops.plan.offline import offline_plan

JOB = {"model": "mnist_cnn", "trainData": "gs://data/datasets/mnist/train-*.tfrecord",
       "evalData": None, "globalBatchSize": 1024, "trainSteps": 5000, "stepsPerExecution": 100,
       "checkpointEverySteps": 500, "checkpointDir": "gs://ckpt/ckpt/dev-trainer/",
       "exportDir": "gs://ckpt/export/dev-trainer/", "tensorboardDir": "gs://logs/tb/dev-trainer/"}


def test_the_dev_stack_serves_its_planned_metadata() -> None:
    name, metadata = pick_node(planned_nodes(offline_plan("dev")), None)
    assert name == "node-trainer"
    assert metadata[STARTUP_SCRIPT_KEY] == startup_script()
    assert len(metadata[PACKAGE_SHA256_KEY]) == 64
    assert '"model": "mnist_cnn"' in metadata[JOB_KEY]


def test_an_unknown_node_names_the_stack_nodes() -> None:
    with pytest.raises(RehearsalError, match="--node 'nope': the stack's nodes are node-trainer"):
        pick_node({"node-trainer": {}}, "nope")


def test_a_node_is_picked_by_its_logical_name() -> None:
    assert pick_node({"node-a": {"k": "a"}, "node-trainer": {"k": "t"}}, "trainer") == (
        "node-trainer", {"k": "t"})


def test_gs_locations_become_local_folders(tmp_path: Path) -> None:
    job, changed = rehearsal_job(JOB, tmp_path)
    assert job["trainData"] == f"{tmp_path}/data/datasets/mnist/train-*.tfrecord"
    assert job["checkpointDir"] == f"{tmp_path}/ckpt/ckpt/dev-trainer/"
    assert job["evalData"] is None
    assert changed["exportDir"] == ("gs://ckpt/export/dev-trainer/",
                                    f"{tmp_path}/ckpt/export/dev-trainer/")


@pytest.mark.parametrize(("steps", "batch", "expected"), [
    (None, None, (40, 10, 10, 64)),
    (25, 8, (24, 6, 6, 8)),
    (2, None, (2, 1, 1, 64)),
    (10_000, 4096, (5000, 100, 100, 1024)),
])
def test_the_job_is_cpu_sized_in_whole_executions(
        tmp_path: Path, steps: int | None, batch: int | None,
        expected: tuple[int, int, int, int]) -> None:
    job, changed = rehearsal_job(JOB, tmp_path, steps, batch)
    assert (job["trainSteps"], job["stepsPerExecution"], job["checkpointEverySteps"],
            job["globalBatchSize"]) == expected
    assert changed["checkpointEverySteps"] == ("500", str(expected[2]))


def test_the_model_is_narrow_and_resnet_images_small(tmp_path: Path) -> None:
    """What keeps a rehearsal under 200 MB: a mnist_cnn checkpoint of 307 MB at full width."""
    mnist, changed = rehearsal_job(JOB, tmp_path)
    assert mnist["widthMultiplier"] == REHEARSAL_WIDTH and "imageSize" not in mnist
    assert changed["widthMultiplier"] == ("None", str(REHEARSAL_WIDTH))
    resnet, _ = rehearsal_job(JOB | {"model": "resnet50", "imageSize": 224,
                                     "widthMultiplier": 0.125}, tmp_path)
    assert (resnet["imageSize"], resnet["widthMultiplier"]) == (REHEARSAL_IMAGE_SIZE, 0.125)


@pytest.mark.parametrize("option", ["--steps", "--batch"])
def test_zero_steps_or_batch_are_refused(option: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import ops.local.rehearse
    from ops.cli import app

    monkeypatch.setattr(ops.local.rehearse, "rehearse", lambda *a, **k: 0)
    result = CliRunner().invoke(app, ["rehearse", option, "0"])
    assert result.exit_code == 2
    text = " ".join(result.stderr.replace("│", " ").split())  # typer's error panel
    assert f"Invalid value for '{option}': Input should be greater than or equal to 1" in text


def test_synthetic_data_goes_where_train_and_eval_patterns_look(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ops.local.rehearse
    from ops.terminal import console

    commands: list[list[str]] = []

    def synth(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        out, prefix = command[command.index("--out") + 1], command[command.index("--prefix") + 1]
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{prefix}-00000-of-00002.tfrecord").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(ops.local.rehearse.subprocess, "run", synth)
    monkeypatch.setattr(ops.local.rehearse, "TRAINING_PYTHON", Path(sys.executable))
    job = {"model": "resnet50", "globalBatchSize": 64, "imageSize": 32, "numClasses": 1000,
           "trainData": f"{tmp_path}/imagenet/train-*.tfrecord",
           "evalData": f"{tmp_path}/imagenet/validation-*.tfrecord"}
    write_datasets(job, console())
    assert [c[c.index("--prefix") + 1] for c in commands] == ["train", "validation"]
    assert commands[0][-4:] == ["--image-size", "32", "--num-classes", "1000"]


def test_a_failed_rehearsal_shows_the_jobs_error_line(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("tpu-stack-agent: state=running\n"
                   "tpu_training: error: tpu-stack:jobs.x.evalData: matches no file\n"
                   "tpu-stack-agent: state=failed job exited with code 2; see job.log\n")
    assert last_error_line(log) == "tpu_training: error: tpu-stack:jobs.x.evalData: matches no file"
    log.write_text("Traceback ...\nMemoryError\n")
    assert last_error_line(log) == "MemoryError"
    assert last_error_line(tmp_path / "absent.log") is None


def test_the_synthetic_data_has_the_jobs_record_format_and_shape(tmp_path, monkeypatch) -> None:
    from ops.local import rehearse

    commands = []

    def fake_run(command, **_):
        commands.append(command)
        (tmp_path / "train-00000-of-00002.tfrecord").write_bytes(b"")
        return rehearse.subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(rehearse.subprocess, "run", fake_run)
    job = {**JOB, "model": "resnet18", "recordFormat": "imagenet", "imageSize": 64,
           "numClasses": 10, "trainData": f"{tmp_path}/train-*.tfrecord"}
    rehearse.write_dataset("trainData", job, rehearse.Console(quiet=True))
    assert commands[0][-6:] == ["--format", "imagenet", "--image-size", "64",
                                "--num-classes", "10"]
