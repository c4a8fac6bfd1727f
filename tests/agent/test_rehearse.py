"""`tpuctl rehearse` helpers: which metadata it serves and how it shrinks the job."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from node_agent import RELEASE_KEY, STARTUP_SCRIPT_KEY, startup_script
from ops.plan.offline import offline_plan
from ops.rehearse.rehearsal import (
    REHEARSAL_IMAGE_SIZE,
    REHEARSAL_WIDTH,
    RehearsalError,
    last_error_line,
    pick_node,
    planned_nodes,
    planned_release,
    rehearsal_job,
    write_datasets,
)

JOB = {"model": "mnist_cnn", "trainData": "gs://data/datasets/mnist/train-*.tfrecord",
       "evalData": None, "globalBatchSize": 1024, "trainSteps": 5000, "stepsPerExecution": 100,
       "checkpointEverySteps": 500, "checkpointDir": "gs://ckpt/ckpt/dev-trainer/",
       "exportDir": "gs://ckpt/export/dev-trainer/", "tensorboardDir": "gs://logs/tb/dev-trainer/"}


def test_the_dev_stack_serves_its_planned_metadata() -> None:
    plan = offline_plan("dev")
    name, metadata = pick_node(planned_nodes(plan), None)
    assert name == "node-trainer"
    assert metadata[STARTUP_SCRIPT_KEY] == startup_script()
    assert metadata[RELEASE_KEY].endswith("/releases/dev-trainer/")
    release = planned_release(plan, metadata)  # the release object under that prefix (C1)
    assert len(release["sha256"]) == 64
    assert release["package"].endswith(f"tpu_training-{release['sha256']}.tar.gz")
    assert release["job"]["model"] == "mnist_cnn"


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

    import ops.rehearse.rehearsal
    from ops.cli import app

    monkeypatch.setattr(ops.rehearse.rehearsal, "rehearse", lambda *a, **k: 0)
    result = CliRunner().invoke(app, ["rehearse", option, "0"])
    assert result.exit_code == 2
    text = " ".join(result.stderr.replace("│", " ").split())  # typer's error panel
    assert f"Invalid value for '{option}': Input should be greater than or equal to 1" in text


def test_synthetic_data_goes_where_train_and_eval_patterns_look(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import ops.rehearse.rehearsal
    from ops.terminal import console

    commands: list[list[str]] = []
    processes = []

    def synth(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        processes.append(command)
        for args in json.loads(command[-1]):  # one process writes every dataset
            commands.append(args)
            out, prefix = args[args.index("--out") + 1], args[args.index("--prefix") + 1]
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / f"{prefix}-00000-of-00002.tfrecord").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(ops.rehearse.rehearsal.subprocess, "run", synth)
    monkeypatch.setattr(ops.rehearse.rehearsal, "synth_env", lambda: {})
    job = {"model": "resnet50", "globalBatchSize": 64, "imageSize": 32, "numClasses": 1000,
           "trainData": f"{tmp_path}/imagenet/train-*.tfrecord",
           "evalData": f"{tmp_path}/imagenet/validation-*.tfrecord"}
    write_datasets(job, console())
    assert len(processes) == 1  # TensorFlow starts once for both
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
    import json

    from ops.rehearse import rehearsal as rehearse

    commands = []

    def fake_run(command, **_):
        commands.append(command)
        (tmp_path / "train-00000-of-00002.tfrecord").write_bytes(b"")
        return rehearse.subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(rehearse.subprocess, "run", fake_run)
    job = {**JOB, "model": "resnet18", "recordFormat": "imagenet", "imageSize": 64,
           "numClasses": 10, "trainData": f"{tmp_path}/train-*.tfrecord"}
    rehearse.write_dataset("trainData", job, rehearse.Console(quiet=True))
    assert json.loads(commands[0][-1])[0][-6:] == ["--format", "imagenet", "--image-size",
                                                   "64", "--num-classes", "10"]


def test_the_image_environment_writes_the_synthetic_data(tmp_path: Path) -> None:
    """No training venv: the image's Python, the package's source, its tf-keras wheel."""
    from ops.rehearse import rehearsal as rehearse

    env = rehearse.synth_env()
    paths = env["PYTHONPATH"].split(":")
    assert paths[0] == str(rehearse.TRAINING_DIR)
    assert Path(paths[1]).name.startswith("tf_keras-2.18.")
    job = {**JOB, "trainData": f"{tmp_path}/mnist/train-*.tfrecord", "globalBatchSize": 64}
    rehearse.write_dataset("trainData", job, rehearse.Console(quiet=True), env)
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def test_a_pod_slice_is_planned_with_its_workers() -> None:
    from ops.rehearse.rehearsal import planned_slices

    assert planned_slices(offline_plan("prod"))["node-pod"][1] == 4  # v4 2x2x4: 4 hosts
    assert planned_slices(offline_plan("dev"))["node-trainer"][1] == 1


def test_each_worker_sees_its_own_number_and_every_workers_endpoint() -> None:
    from ops.rehearse.rehearsal import worker_view

    views = [worker_view({"tpu-stack-workers": "0"}, worker, 4) for worker in range(4)]
    assert [v["agent-worker-number"] for v in views] == ["0", "1", "2", "3"]
    endpoints = {v["worker-network-endpoints"] for v in views}
    assert endpoints == {"unknown:unknown:127.0.0.1,unknown:unknown:127.0.0.2,"
                         "unknown:unknown:127.0.0.3,unknown:unknown:127.0.0.4"}
    assert worker_view({}, 0, 1) == {"agent-worker-number": "0"}  # single host: no endpoints


def test_a_pod_rehearsal_runs_a_hot_update_a_failed_worker_and_a_notice_to_all(
        gcs, archive, package_uri: str, dataset: str, tmp_path: Path) -> None:
    """Issue 20 item 8, end to end: 4 workers, each its own metadata server and agent."""
    import re
    import signal

    from model.archive import build_archive
    from ops.local.local_node import node_attributes, publish_release
    from ops.rehearse import rehearsal as rehearse
    from tests.agent.conftest import BUCKET, job_config, training_copy, upload_package

    job = job_config(dataset, tmp_path / "job", 2000) | {"widthMultiplier": 0.25}
    prefix = f"gs://{BUCKET}/status/pod-{tmp_path.name}/"
    releases = f"gs://{BUCKET}/releases/pod-{tmp_path.name}/"
    publish_release(gcs, releases, package_uri, archive.sha256, job)
    metadata = node_attributes(releases, prefix, workers="0")
    new = build_archive(training_copy(tmp_path, "v2"))
    new_uri = upload_package(gcs, new)

    def wait_for(condition, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: " + str(
                [w.guest for w in pod.workers])
            time.sleep(0.2)

    with rehearse.Pod(metadata, 4, tmp_path / "pod", gcs.host) as pod:
        pod.start(tmp_path)
        lead, others = pod.workers[0], pod.workers[1:]
        wait_for(lambda: int(lead.guest.get("step", 0)) >= 4, "worker 0 to train")
        wait_for(lambda: all(w.guest.get("state") == "idle" for w in others), "idle workers")
        assert all("worker 0 runs the TensorFlow client" in w.guest["message"] for w in others)

        publish_release(gcs, releases, new_uri, new.sha256, job)  # a code change: a new release
        wait_for(lambda: all(w.guest.get("package") == new.sha256 for w in pod.workers),
                 "every worker to take the update")
        resumed = re.compile(rf"starting job: package {new.sha256}[\s\S]*^tpu_training step=",
                             re.M)
        wait_for(lambda: resumed.search(lead.node.job_log_path().read_text()) is not None,
                 "worker 0 to train on the new package")

        others[1].stop(signal.SIGKILL)  # worker 2's agent dies
        pod.preempt()  # the notice, to every worker at once
        codes = pod.finish(timeout=120)
        states = {w.number: w.guest.get("state") for w in pod.workers}
        polled = [w.node.metadata.read("instance/preempted", {}) for w in pod.workers]
        status_dir = rehearse.keep_status(gcs, prefix, tmp_path)
        table = rehearse.status_table(pod, job, status_dir, codes)
        code = rehearse.outcome(pod, codes, status_dir, rehearse.Console(quiet=True))

    assert codes == {0: 75, 1: 0, 2: -signal.SIGKILL, 3: 0}
    assert code == 75
    assert states == {0: "preempted", 1: "idle", 2: "idle", 3: "idle"}
    assert polled == [(200, "TRUE")] * 4
    log = (status_dir / "worker-0" / "job.log").read_text()
    assert "update installed: stopping the job so it checkpoints" in log
    update_stop, notice_stop = re.findall(r"^tpu_training stopped_at=(\d+)", log, re.M)
    assert int(notice_stop) > int(update_stop)  # resumed on the new package, then the notice
    assert (tmp_path / "job" / "ckpt" / f"ckpt-{notice_stop}.index").exists()
    rows = list(zip(*(column.cells for column in table.columns), strict=True))
    assert [row[:2] for row in rows] == [("0", "preempted"), ("1", "idle"), ("2", "failed"),
                                         ("3", "idle")]
    assert rows[2][-1] == f"the agent exited with {-signal.SIGKILL}"


def test_the_summary_says_which_workers_ran_and_what_a_short_evaluation_means(
        tmp_path: Path) -> None:
    from types import SimpleNamespace

    from ops.rehearse.rehearsal import about_the_run

    (tmp_path / "worker-0").mkdir()
    (tmp_path / "worker-0" / "job.log").write_text(
        "tpu_training step=40 loss=4.98\ntpu_training eval_accuracy=0.001953 eval_loss=189.7\n")
    job = {"trainSteps": 40, "numClasses": 1000}
    pod, single = SimpleNamespace(hosts=4), SimpleNamespace(hosts=1)
    lines = about_the_run(pod, job, tmp_path)  # type: ignore[arg-type]
    assert lines[0].startswith("workers rehearsed: all 4 (0-3), each with its own metadata")
    assert "so workers 1-3 are idle here, serving worker 0 as their agents do" in lines[0]
    assert lines[1] == ("evaluation after 40 steps: eval_accuracy=0.001953 eval_loss=189.7. It "
                        "shows that evaluation runs, not how good a model is: the synthetic data "
                        "is easy to learn, so any accuracy from chance (1/1000 = 0.001) to 1 is "
                        "expected.")
    assert about_the_run(single, job, tmp_path / "none")[0] == (  # type: ignore[arg-type]
        "workers rehearsed: 0, the node's only worker (single host).")


# ---- issue 29: every node, each kept; the dev stack evaluates; the release explained ----


def test_every_node_is_rehearsed_each_in_a_folder_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from ops.rehearse import rehearsal as rehearse

    calls = []

    def one_node(stack, name, metadata, hosts, release_object, workdir, console, steps, batch,
                 data=None):
        calls.append((name, hosts, workdir, release_object[0].split("/releases/")[1][:15]))
        return {"node-nlp-sweep": 0, "node-nlp-pod": 75}[name]

    monkeypatch.setattr(rehearse, "rehearse_node", one_node)
    out = StringIO()
    console = rehearse.Console(file=out, width=300)
    every = rehearse.rehearse("platform", workdir=tmp_path, console=console)
    named = rehearse.rehearse("platform", workdir=tmp_path, console=console, node="sweep")

    assert every == 75 and named == 0
    assert calls == [
        ("node-nlp-pod", 4, tmp_path / "node-nlp-pod", "platform-nlp-po"),
        ("node-nlp-sweep", 1, tmp_path / "node-nlp-sweep", "platform-nlp-sw"),
        ("node-nlp-sweep", 1, tmp_path / "node-nlp-sweep", "platform-nlp-sw")]
    text = out.getvalue()
    assert ("stack platform has 2 nodes: rehearsing each, one after another (node-nlp-pod, "
            "node-nlp-sweep; --node NAME rehearses one)") in text
    assert "rehearsed: node-nlp-pod exit 75, node-nlp-sweep ok" in text


def test_the_dev_stack_evaluates_as_the_readme_says() -> None:
    plan = offline_plan("dev")
    _, metadata = pick_node(planned_nodes(plan), None)
    job = planned_release(plan, metadata)["job"]
    assert job["evalData"].endswith("/datasets/mnist/test-*.tfrecord")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "synthetic dataset (train and eval)" in readme


def test_the_rehearsal_says_why_its_release_differs_from_the_plans() -> None:
    from ops.rehearse.rehearsal import release_lines

    planned = "gs://acme-ml-dev-dev-artifacts/releases/dev-trainer/aaaa.json"
    rehearsed = "gs://acme-ml-dev-dev-artifacts/releases/dev-trainer/bbbb.json"
    assert release_lines(planned, rehearsed, "c" * 64) == [
        f"release: the plan uploads {planned}",
        f"  rehearsed as {rehearsed}: the same package (cccccccccccc...) with the job changed "
        "as above; a release is named by the digest of its content, so the name differs"]
    assert release_lines(planned, planned, "c" * 64) == [
        f"release: {planned}, as the plan uploads it"]


def test_a_rehearsal_record_names_what_changed_since(tmp_path: Path) -> None:
    import json

    from ops.tpu import rehearsal_record as record

    record.write_record(tmp_path, "dev", "node-trainer", "gs://a/p.json", "gs://a/r.json")
    assert record.changed_since(tmp_path, "dev") == []
    saved = json.loads((tmp_path / record.RECORD).read_text())
    assert saved["plannedRelease"] == "gs://a/p.json"
    saved["digests"]["Pulumi.yaml"] = ""
    (tmp_path / record.RECORD).write_text(json.dumps(saved))
    assert record.changed_since(tmp_path, "dev") == ["Pulumi.yaml"]
    assert record.changed_since(tmp_path / "none", "dev") == ["what was rehearsed is unknown"]
