"""A node as it runs on a real TPU VM, rehearsed on loopback: the PJRT environment,
a pod slice addressed without the TPU API, transient failures retried and permanent
ones not, data that arrives after boot, and a preemption notice stopping the job.

Real agent, real bootstrap, GCS emulator and metadata server throughout; the real
job wherever it can show the behaviour on CPU, else the stand-in of
tests/agent/stand_in (why: its docstring).
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from model import catalog
from model.archive import Archive
from node_agent.contract import NETWORK_ENDPOINTS_KEY, NODE_KEY, RUNTIME_KEY
from node_agent.environment import PJRT_KEYS
from ops.local.storage_emulator import StorageEmulator
from ops.tpu.logs import AgentLogs
from tests.agent.conftest import BUCKET, Node, job_config, preinstall, stop

PJRT = "tpu-vm-tf-2.18.0-pjrt"
POD_PJRT = "tpu-vm-tf-2.19.0-pod-pjrt"
WORKER_IPS = ["10.130.0.4", "10.130.0.5", "10.130.0.6", "10.130.0.7"]
EXIT_PREEMPTED = 75


def stand_in_job(kind: str, out: Path, **more: object) -> dict[str, object]:
    return {"standIn": kind, "out": str(out), **more}


def fake_pip_libtpu(tmp: Path) -> tuple[dict[str, str], Path]:
    """An image whose TensorFlow came from pip: libtpu/libtpu.so in site-packages.
    (This machine has no /lib/libtpu.so.)"""
    package = tmp / "site" / "libtpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "libtpu.so").write_bytes(b"\x7fELF")
    return {"PYTHONPATH": str(tmp / "site")}, package / "libtpu.so"


# Single-host images users name (issue 20 item 6), each accepted by the catalog on
# its TPU: the runtimes page's newest, the Preemptible TPUs page's and
# python-docs-samples' 2.17 images, a generation-suffixed name, and a
# stream-executor (-se) image, which loads libtpu without the PJRT plugin variables.
USERS_RUNTIMES = [("v5litepod-4", PJRT, True), ("v3-8", "tpu-vm-tf-2.17.1-pjrt", True),
                  ("v5litepod-1", "tpu-vm-tf-2.17.0-pjrt", True),
                  ("v5litepod-8", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", True),
                  ("v4-8", "tpu-vm-tf-2.16.1-se", False)]


@pytest.mark.parametrize(("accelerator", "runtime", "pjrt"), USERS_RUNTIMES)
def test_a_single_host_job_gets_the_plugin_variables_its_runtime_needs(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path,
        accelerator: str, runtime: str, pjrt: bool) -> None:
    assert catalog.runtime_problem(catalog.parse_accelerator_type(accelerator), runtime) is None
    env, libtpu = fake_pip_libtpu(tmp_path)
    out = tmp_path / "env.json"
    node = make_node(*stand_in, stand_in_job("environment", out), extra={RUNTIME_KEY: runtime},
                     env=env)

    result = node.boot()

    assert result.returncode == 0, result.stdout + result.stderr
    job_env = json.loads(out.read_text())
    if pjrt:
        assert job_env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == str(libtpu)
        assert job_env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    else:
        assert not set(PJRT_KEYS) & set(job_env)
    assert "TPU_NAME" not in job_env
    assert "TPU_LOAD_LIBRARY" not in job_env
    assert node.guest["state"] == "succeeded"


def test_pjrt_job_env_keeps_what_the_agent_was_given(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    given = {"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/image/libtpu.so",
             "NEXT_PLUGGABLE_DEVICE_USE_C_API": "false"}
    node = make_node(*stand_in, stand_in_job("environment", out), extra={RUNTIME_KEY: PJRT},
                     env=given)

    assert node.boot().returncode == 0
    job_env = json.loads(out.read_text())
    assert {key: job_env[key] for key in PJRT_KEYS} == given


def test_pod_worker_0_addresses_every_worker_by_grpc_without_the_tpu_api(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    endpoints = ",".join(f"unknown:unknown:{ip}" for ip in WORKER_IPS)
    node = make_node(*stand_in, stand_in_job("environment", out), workers="0", worker=0,
                     extra={RUNTIME_KEY: POD_PJRT, NETWORK_ENDPOINTS_KEY: endpoints,
                            NODE_KEY: "tpu-stack-dev-trainer"})

    result = node.boot()

    assert result.returncode == 0, result.stdout + result.stderr
    job_env = json.loads(out.read_text())
    assert job_env["TPU_NAME"] == ",".join(f"grpc://{ip}:8470" for ip in WORKER_IPS)
    assert job_env["TPU_LOAD_LIBRARY"] == "0"
    assert not set(PJRT_KEYS) & set(job_env)  # the client loads no libtpu on a pod
    assert node.status_object()["node"] == "tpu-stack-dev-trainer"


def test_a_transient_tpu_failure_is_retried_until_the_job_trains(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    node = make_node(*stand_in, stand_in_job("flaky", runs, failures=2))

    result = node.boot()

    assert result.returncode == 0, result.stdout + result.stderr
    assert runs.read_text() == "3"
    log = node.job_log()
    assert log.count("starting job") == 3
    assert log.count("state=retrying job exited with code 69: TPU 'local' did not "
                     "initialise: UnavailableError: TPU in use; retrying in") == 2
    assert node.guest["state"] == "succeeded"
    assert node.guest["step"] == "8"


def test_a_permanent_config_error_fails_at_once_with_the_jobs_error(
        make_node: Callable[..., Node], archive: Archive, package_uri: str,
        installed_package: Path, dataset: str, tmp_path: Path) -> None:
    job = job_config(dataset, tmp_path) | {"trainSteps": 0}
    node = make_node(package_uri, archive.sha256, job)
    preinstall(node, installed_package, archive.sha256)

    result = node.boot()

    assert result.returncode == 1
    assert node.guest["state"] == "failed"
    message = node.guest["message"]
    assert message.startswith("job exited with code 2: trainSteps: "), message
    assert node.job_log().count("starting job") == 1  # not retried
    assert node.status_object()["message"] == message


def test_data_uploaded_20s_after_boot_is_trained_on_without_a_reboot(
        make_node: Callable[..., Node], archive: Archive, package_uri: str,
        installed_package: Path, dataset: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    pattern = str(data / "*.tfrecord")
    node = make_node(package_uri, archive.sha256, job_config(pattern, tmp_path / "job", 400))
    preinstall(node, installed_package, archive.sha256)
    booted = time.monotonic()
    boot = node.start()
    try:
        # Guest attributes are written one key at a time: wait for both.
        node.wait_for(lambda: node.guest.get("state") == "waiting-for-data"
                      and pattern in node.guest.get("message", ""), "waiting-for-data")
        time.sleep(max(0.0, booted + 20 - time.monotonic()))
        for shard in Path(dataset).parent.glob("*.tfrecord"):
            shutil.copy(shard, data / shard.name)
        # Trained on: steps on the new data; then stop (the export is not the point).
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 4, "steps on the new data")
        boot.send_signal(signal.SIGTERM)
        output, _ = boot.communicate(timeout=120)
    finally:
        stop(boot)

    assert boot.returncode == EXIT_PREEMPTED, output
    log = node.job_log()
    assert f"data found for {pattern}; starting the job" in log
    assert log.count("starting job") == 1  # one boot, one job: no reboot, no rerun
    assert re.search(r"^tpu_training step=[4-9]", log, re.M)
    goodput = node.status_object()["goodput"]
    assert goodput["waiting_for_data"] > 5  # the agent's own category


def test_a_preemption_notice_stops_the_job_with_a_checkpoint(
        make_node: Callable[..., Node], archive: Archive, package_uri: str,
        installed_package: Path, dataset: str, tmp_path: Path, gcs: StorageEmulator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "job"
    # The node's notice reaches the job in its release (contract C3); this tiny one bounds
    # an execution to 0.1 s, so executions stay far below stepsPerExecution (issue 20 item 2).
    job = job_config(dataset, work, 400) | {"stepsPerExecution": 40, "checkpointEverySteps": 400,
                                            "noticeSeconds": 0.4}
    node = make_node(package_uri, archive.sha256, job)
    preinstall(node, installed_package, archive.sha256)
    boot = node.start()
    try:
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 4, "a first step")
        flipped = time.monotonic()
        node.metadata.preempt()
        output, _ = boot.communicate(timeout=120)
        stopped_in = time.monotonic() - flipped
    finally:
        stop(boot)

    assert boot.returncode == EXIT_PREEMPTED, output
    # What must hold is below; the time is a figure (bench/stop_to_saved.py), this bound
    # only catches a hang, with room for a busy 2-core machine.
    assert stopped_in < 60, (f"the job took {stopped_in:.1f}s to stop (a hang; the figure "
                             "is bench/stop_to_saved.py)")
    log = node.job_log()
    (reached,) = re.findall(r"^tpu_training stopped_at=(\d+)", log, re.M)
    assert (work / "ckpt" / f"ckpt-{reached}.index").exists()
    steps = [int(n) for n in re.findall(r"^tpu_training step=(\d+) ", log, re.M)]
    assert steps[:2] == [1, 2]  # sized by the notice: two one-step executions first
    assert max(b - a for a, b in itertools.pairwise(steps)) < 40
    stop_at = log.index("instance/preempted=TRUE: stopping the job")
    stopped_at = log.index(f"tpu_training stopped_at={reached}")
    assert stop_at < stopped_at  # the stop came before the save it caused
    for save in re.finditer(rf"^tpu_training saved step={reached} .*reason=stop", log, re.M):
        assert stop_at < save.start() < stopped_at
    assert node.guest["state"] == "preempted"
    assert node.guest["message"] == (f"stopped (instance/preempted=TRUE) after saving step "
                                     f"{reached}")
    assert "instance/preempted=TRUE: stopping the job so it saves inside the notice" in log
    polls = node.metadata.long_polls("instance/preempted")
    assert polls and all(poll.get("last_etag") for poll in polls)
    goodput = node.status_object()["goodput"]
    assert goodput["infrastructure_recovery"] > 0
    assert goodput["total"] > 0
    # status.json carries the fields as custom metadata: `tpuctl status` reads every
    # node's from one listing of the logs bucket (ops/tpu/logs.py).
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.host)
    listed = AgentLogs("test").published(BUCKET, "status/")
    fields = listed[node.status_prefix.removeprefix(f"gs://{BUCKET}/")]
    assert fields["state"] == "preempted"
    assert fields["step"] == reached
    assert json.loads(fields["goodput"]) == goodput


def test_goodput_totals_survive_a_restart_of_the_agent(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    node = make_node(*stand_in, stand_in_job("flaky", runs, failures=1))
    boot = node.start()
    try:
        node.wait_for(lambda: node.guest.get("state") == "retrying", "the first retry")
        boot.send_signal(signal.SIGTERM)
        boot.communicate(timeout=60)
    finally:
        stop(boot)
    before = node.status_object()["goodput"]
    assert before["total"] > 0

    result = node.boot()

    assert result.returncode == 0, result.stdout + result.stderr
    after = node.status_object()["goodput"]
    assert after["job"] == before["job"]
    assert after["total"] > before["total"]
    assert after["infrastructure_recovery"] >= before["infrastructure_recovery"]
    assert runs.read_text() == "2"
