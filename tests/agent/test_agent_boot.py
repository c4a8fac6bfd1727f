"""Boots of a TPU worker on loopback: the startup script, end to end.

Each test runs the real `startup-script` value with bash against a GCS emulator
and a metadata server, installs the real package archive, and runs the real
training job (mnist_cnn, a few dozen steps on CPU) with the image's Python.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from model.archive import Archive, build_archive
from node_agent import build
from ops.local.local_node import IMAGE_PYTHON
from ops.local.storage_emulator import StorageEmulator
from tests.agent.conftest import BUCKET, Node, job_config, stop, training_copy, upload_package
from tests.fakes.fault_proxy import FaultProxy

EXIT_PREEMPTED = 75
DOWNLOADS = "/o/packages%2F"  # package downloads (the status object is read too)
LONG_STEPS = 400  # long enough to act while the job trains


def resumed_from(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"^tpu_training resumed_from=(\d+)", log, re.M)]


def checkpoints(work: Path) -> list[str]:
    folder = work / "ckpt"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_first_boot_trains_to_success_and_a_reboot_changes_nothing(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        gcs: StorageEmulator, tmp_path: Path) -> None:
    work = tmp_path / "job"
    node = make_node(package_uri, archive.sha256, job_config(dataset, work))

    first = node.boot()

    assert first.returncode == 0, first.stdout + first.stderr
    assert node.guest["state"] == "succeeded"
    assert node.guest["package"] == archive.sha256
    assert int(node.guest["step"]) == 24
    assert node.status_object() is not None
    assert node.status_object()["state"] == "succeeded"
    log = node.job_log()
    assert "tpu_training step=24" in log
    assert log.count("starting job") == 1
    assert node.installed_packages() == [archive.sha256]
    assert node.metadata.token_requests >= 1  # GCS was asked with the node's token
    exported = sorted(p.name for p in (work / "export").iterdir())
    assert exported

    with FaultProxy(gcs.host, failures=0, match=DOWNLOADS) as proxy:
        node.storage_host = proxy.host
        second = node.boot()
    assert second.returncode == 0, second.stdout + second.stderr
    assert proxy.matched == 0  # nothing downloaded again
    assert node.guest["state"] == "succeeded"
    assert node.guest["step"] == "24"
    assert node.job_log().count("starting job") == 1  # not retrained
    assert sorted(p.name for p in (work / "export").iterdir()) == exported


def test_sha256_mismatch_is_refused_and_never_run(
        make_node: Callable[..., Node], package_uri: str, tmp_path: Path) -> None:
    claimed = hashlib.sha256(b"some other package").hexdigest()
    node = make_node(package_uri, claimed, job_config("/nowhere/*", tmp_path))

    result = node.boot()

    assert result.returncode == 1
    assert node.guest["state"] == "failed"
    assert f"has sha256 {package_uri.split('-')[-1].split('.')[0]}, not {claimed}; refusing" \
        in node.guest["message"]
    assert node.installed_packages() == []
    assert "starting job" not in node.job_log()
    assert node.status_object()["state"] == "failed"


def test_missing_package_object_fails_at_once_with_its_uri(
        make_node: Callable[..., Node], archive: Archive, gcs: StorageEmulator,
        tmp_path: Path) -> None:
    missing = f"gs://{BUCKET}/packages/tpu_training-absent.tar.gz"
    with FaultProxy(gcs.host, failures=0, match=DOWNLOADS) as proxy:
        node = make_node(missing, archive.sha256, job_config("/nowhere/*", tmp_path),
                         storage_host=proxy.host)
        result = node.boot()

    assert result.returncode == 1
    assert node.guest["state"] == "failed"
    assert node.guest["message"] == f"the release's package: {missing} does not exist (HTTP 404)"
    assert proxy.matched == 1  # a 404 is an answer, not retried
    assert node.installed_packages() == []


def test_storage_answering_503_is_retried_until_it_succeeds(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        gcs: StorageEmulator, tmp_path: Path) -> None:
    with FaultProxy(gcs.host, failures=3, match=DOWNLOADS) as proxy:
        node = make_node(package_uri, archive.sha256, job_config(dataset, tmp_path, 8),
                         storage_host=proxy.host)
        result = node.boot()

    assert result.returncode == 0, result.stdout + result.stderr
    assert proxy.faults_sent == 3
    assert proxy.matched == 4
    assert node.guest["state"] == "succeeded"
    assert result.stderr.count("HTTP 503; retrying in about") == 3


def test_package_change_while_training_checkpoints_installs_and_resumes(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        gcs: StorageEmulator, tmp_path: Path) -> None:
    work = tmp_path / "job"
    node = make_node(package_uri, archive.sha256, job_config(dataset, work, 32))
    new = build_archive(training_copy(tmp_path, "v2"))
    new_uri = upload_package(gcs, new)
    boot = node.start()
    try:
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 8, "training to pass step 8")
        # Freeze the job so the update lands mid-training however fast this machine is.
        job_pid = int((node.root / "run" / "job.pid").read_text().split()[0])
        os.kill(job_pid, signal.SIGSTOP)
        node.publish(new_uri, new.sha256, job_config(dataset, work, 32))
        node.wait_for(lambda: new.sha256 in node.installed_packages(), "the new package")
        os.kill(job_pid, signal.SIGCONT)
        output, _ = boot.communicate(timeout=240)
    finally:
        stop(boot)

    assert boot.returncode == 0, output
    assert node.guest["state"] == "succeeded"
    assert node.guest["package"] == new.sha256
    assert node.installed_packages() == sorted([archive.sha256, new.sha256])
    log = node.job_log()
    before_update, after_update = log.split(f"starting job: package {new.sha256}")
    assert "update installed: stopping the job so it checkpoints" in before_update
    assert resumed_from(after_update)[0] >= 8
    assert "tpu_training step=32" in after_update


def test_sigterm_stops_the_job_with_a_checkpoint_and_status_preempted(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        tmp_path: Path) -> None:
    work = tmp_path / "job"
    node = make_node(package_uri, archive.sha256, job_config(dataset, work, LONG_STEPS))
    boot = node.start()
    try:
        node.wait_for(lambda: node.guest.get("state") == "running", "the job to start")
        second = node.boot()  # a rerun of the startup script while the agent runs
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 4, "a first step")
        boot.send_signal(signal.SIGTERM)  # bash exec'd the agent: this is the agent
        output, _ = boot.communicate(timeout=180)
    finally:
        stop(boot)

    assert second.returncode == 0
    assert "another agent already supervises" in second.stderr
    assert boot.returncode == EXIT_PREEMPTED, output
    assert node.guest["state"] == "preempted"
    assert node.status_object()["state"] == "preempted"
    assert checkpoints(work)
    assert node.job_log().count("starting job") == 1


def test_a_job_left_by_a_killed_agent_is_stopped_by_pid_before_a_new_one_starts(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        tmp_path: Path) -> None:
    node = make_node(package_uri, archive.sha256, job_config(dataset, tmp_path, LONG_STEPS))
    boot = node.start()
    try:
        node.wait_for(lambda: node.guest.get("state") == "running", "the job to start")
        stale_pid = int((node.root / "run" / "job.pid").read_text().split()[0])
        boot.kill()  # the agent dies; its job (own session) keeps the "TPU"
        boot.wait()
        short = job_config(dataset, tmp_path / "short", 8)
        node.publish(package_uri, archive.sha256, short)
        result = node.boot()
    finally:
        stop(boot)

    assert f"stopping job pid {stale_pid} left by an earlier agent" in result.stderr
    assert not Path(f"/proc/{stale_pid}").exists() or _is_zombie(stale_pid)
    assert result.returncode == 0, result.stderr
    assert node.guest["state"] == "succeeded"


def _is_zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_pod_worker_other_than_0_launches_no_client(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, gcs: StorageEmulator,
        tmp_path: Path) -> None:
    with FaultProxy(gcs.host, failures=0, match=DOWNLOADS) as proxy:
        node = make_node(package_uri, archive.sha256, job_config("/nowhere/*", tmp_path),
                         workers="0", worker=1, storage_host=proxy.host)
        started = time.monotonic()
        result = node.boot()

    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    assert node.guest["state"] == "idle"
    assert "worker 0 runs the TensorFlow client" in node.guest["message"]
    assert proxy.matched == 0
    assert "starting job" not in node.job_log(worker=1)
    assert node.status_object(worker=1)["state"] == "idle"
    assert not (node.root / "run" / "job.pid").exists()


def test_as_a_service_a_finished_node_takes_the_next_release(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        tmp_path: Path) -> None:
    node = make_node(package_uri, archive.sha256, job_config(dataset, tmp_path / "a", 8))
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(build.zipapp())
    service = subprocess.Popen([str(IMAGE_PYTHON), str(agent), "run", "--stay"], env=node.env,
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        node.wait_for(lambda: "waiting for a new release" in node.job_log_path().read_text()
                      if node.job_log_path().exists() else False, "the first job to finish")
        assert node.guest["state"] == "succeeded"
        second = job_config(dataset, tmp_path / "b", 8)
        node.publish(package_uri, archive.sha256, second)
        node.wait_for(lambda: node.job_log_path().read_text().count("waiting for a new release")
                      == 2, "the second job to finish")
        service.send_signal(signal.SIGTERM)
        output, _ = service.communicate(timeout=60)
    finally:
        stop(service)

    assert service.returncode == 0, output
    assert node.job_log().count("starting job") == 2
    assert (tmp_path / "b" / "export").is_dir()
