"""The node on day 2, on loopback (issue 20): releases found by listing their prefix,
a pod worker keeping its TPU runtime up for worker 0's save, a TPU held by someone
else, and a checkpoint before scheduled maintenance.

Real agent (the zipapp), GCS emulator and metadata server; the real job where a CPU
shows the behaviour, else the stand-in of tests/agent/stand_in.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from model.archive import Archive
from node_agent import build
from node_agent.common import parse_utc
from node_agent.desired import current_release
from node_agent.metadata import Metadata
from node_agent.storage import Storage
from ops.local.local_node import IMAGE_PYTHON, publish_release
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator
from tests.agent.conftest import BUCKET, Node, job_config, preinstall, stop
from tests.agent.test_agent_units import hold_tpu

EXIT_PREEMPTED = 75


def stand_in_job(kind: str, out: Path, **more: object) -> dict[str, object]:
    return {"standIn": kind, "out": str(out), **more}


def start_service(node: Node, tmp_path: Path) -> subprocess.Popen[str]:
    """The agent as the systemd unit runs it: `agent.pyz run --stay`."""
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(build.zipapp())
    return subprocess.Popen([str(IMAGE_PYTHON), str(agent), "run", "--stay"], env=node.env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def agent_lines(node: Node, worker: int = 0) -> str:
    path = node.job_log_path(worker)
    return path.read_text() if path.exists() else ""


# -- the release pointer (contract C1) ------------------------------------------------


def test_a_node_waits_for_its_first_release_then_runs_it(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    node = make_node(*stand_in, stand_in_job("environment", out), publish=False)
    boot = node.start()
    try:
        node.wait_for(lambda: "no release under" in node.guest.get("message", ""),
                      "the agent to say it has no release")
        assert node.guest["state"] == "retrying"
        assert node.release_prefix in node.guest["message"]
        uri = node.publish(*stand_in, stand_in_job("environment", out))
        output, _ = boot.communicate(timeout=120)
    finally:
        stop(boot)

    assert boot.returncode == 0, output
    assert out.exists()
    assert node.guest["state"] == "succeeded"
    assert node.status_object()["release"] == uri


def test_the_newest_release_under_the_prefix_is_the_one_that_runs(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    node = make_node(*stand_in, stand_in_job("environment", old))
    time.sleep(0.01)  # a later timeCreated (the emulator stamps microseconds)
    newest = node.publish(*stand_in, stand_in_job("environment", new))

    result = node.boot(timeout=120)

    assert result.returncode == 0, result.stdout + result.stderr
    assert new.exists() and not old.exists()
    assert node.status_object()["release"] == newest


def test_the_emulator_lists_time_created_so_the_agent_finds_the_newest(
        gcs: StorageEmulator) -> None:
    # The agent orders releases by timeCreated from objects.list (JSON API); the
    # loopback emulator must answer it in listings, as Cloud Storage does.
    prefix = f"gs://{BUCKET}/releases/listing-check/"
    for model in ("first", "second", "third"):
        newest = publish_release(gcs, prefix, f"gs://{BUCKET}/packages/p.tar.gz", "ab" * 32,
                                 {"model": model})
        time.sleep(0.01)
    with MetadataServer({}) as server:
        storage = Storage(Metadata(server.host), gcs.host)
        (item,) = list(storage.list(BUCKET, "releases/listing-check/release-",
                                    "tpu-stack-release", "name,timeCreated"))[:1]
        assert parse_utc(item["timeCreated"]) is not None
        current = current_release(storage, prefix)
    assert current is not None and current.uri == newest
    assert '"third"' in current.job_json


# -- a pod worker keeps its TPU runtime up for worker 0's save (item 3) -----------------


def test_a_stopping_pod_worker_waits_for_worker_0s_save_bounded_by_the_notice(
        make_node: Callable[..., Node], stand_in: tuple[str, str], gcs: StorageEmulator,
        tmp_path: Path) -> None:
    job = stand_in_job("environment", tmp_path / "env.json", noticeSeconds=120)
    node = make_node(*stand_in, job, workers="0", worker=1)
    worker_0 = f"{node.status_prefix}worker-0/status.json"
    gcs.upload(worker_0, json.dumps({"state": "running", "step": "40"}).encode())
    service = start_service(node, tmp_path)
    try:
        node.wait_for(lambda: "waiting for a new release" in agent_lines(node, 1), "worker 1 idle")
        # The guest attribute follows the log line: on a busy machine, a poll later.
        node.wait_for(lambda: node.guest.get("state") == "idle", "worker 1's guest state idle")
        service.send_signal(signal.SIGTERM)  # systemd stops our unit first (After=)
        node.wait_for(lambda: "until worker 0 reports its save (at most 115s)"
                      in agent_lines(node, 1), "worker 1 to hold")
        time.sleep(2)
        assert service.poll() is None  # the TPU runtime is kept up while worker 0 saves
        gcs.upload(worker_0, json.dumps({"state": "preempted", "stopSave": {
            "step": 41, "seconds": 3.0, "bytes": 1}}).encode())
        output, _ = service.communicate(timeout=60)
    finally:
        stop(service)

    assert service.returncode == 0, output
    assert "worker 0 reports state preempted; letting the runtime go" in agent_lines(node, 1)


# -- a TPU held by someone else (item 5, contract C4) -------------------------------------


def busy_env(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    device, lock = tmp_path / "accel0", tmp_path / "libtpu_lockfile"
    device.write_text("")
    env = {"TPU_STACK_TPU_DEVICES": str(device), "TPU_STACK_LIBTPU_LOCKFILE": str(lock)}
    return env, device, lock


def test_a_tpu_held_by_a_users_process_is_named_and_left_running(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    env, device, lock = busy_env(tmp_path)
    user = hold_tpu(tmp_path, device, lock)
    node = make_node(*stand_in, stand_in_job("busy", tmp_path / "out"), env=env)
    boot = node.start()
    try:
        node.wait_for(lambda: f"pid {user.pid}" in node.guest.get("message", ""),
                      "the holder to be named")
        message = node.guest["message"]
        assert node.guest["state"] == "retrying"
        assert f"the TPU is held by pid {user.pid} (" in message
        assert "user_notebook.py" in message
        assert "not started by this agent, so left running" in message
        assert user.poll() is None  # never killed
        user.terminate()
        user.wait()
        output, _ = boot.communicate(timeout=180)
    finally:
        stop(boot)
        user.kill()

    assert boot.returncode == 0, output
    assert node.guest["state"] == "succeeded"
    assert node.job_log().count("tpu_training tpu_busy") == 1  # not restarted while held


def test_a_stale_libtpu_lockfile_nobody_holds_is_removed(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    env, _, lock = busy_env(tmp_path)
    lock.write_text("")
    os.chown(lock, 65534, 65534)  # left by another user: the job cannot open it to lock it
    node = make_node(*stand_in, stand_in_job("busy", tmp_path / "out"), env=env)

    result = node.boot(timeout=120)

    assert result.returncode == 0, result.stdout + result.stderr
    log = node.job_log()
    assert f"no process holds the TPU: removed the stale {lock}" in log
    assert node.guest["state"] == "succeeded"
    assert lock.stat().st_uid == os.getuid()  # the job's own lock file now


# -- scheduled maintenance (item 7) ----------------------------------------------------


def rfc3339(seconds_from_now: float) -> str:
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
        seconds=seconds_from_now)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def test_scheduled_maintenance_is_shown_and_checkpointed_before_it_starts(
        make_node: Callable[..., Node], archive: Archive, package_uri: str,
        installed_package: Path, dataset: str, tmp_path: Path) -> None:
    work = tmp_path / "job"
    node = make_node(package_uri, archive.sha256, job_config(dataset, work, 400))
    preinstall(node, installed_package, archive.sha256)
    start, end = rfc3339(120), rfc3339(7200)  # inside the agent's 300 s lead
    boot = node.start()
    try:
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 4, "a first step",
                      timeout=300)
        index = work / "ckpt" / "record_counts.json"
        node.wait_for(index.exists, "the fresh start's record index (counted beside training)")
        counted = index.read_bytes(), index.stat().st_mtime_ns
        node.metadata.set_upcoming_maintenance(start, end)
        node.wait_for(lambda: node.job_log().count("starting job") == 2 and
                      node.guest.get("state") == "running", "the job to save and start again",
                      timeout=300)
        node.wait_for(lambda: "tpu_training step=" in second_run(node),
                      "the restarted job to train", timeout=300)
        boot.send_signal(signal.SIGTERM)
        output, _ = boot.communicate(timeout=180)
    finally:
        stop(boot)

    assert boot.returncode == EXIT_PREEMPTED, output
    window = json.loads(node.guest["maintenance"])
    assert window == {"start": start, "end": end, "type": "SCHEDULED", "status": "PENDING"}
    assert node.status_object()["maintenance"] == window
    log = node.job_log()
    assert f"maintenance window from {start} to {end}: stopping the job so it saves" in log
    first_stop = int(re.findall(r"^tpu_training stopped_at=(\d+)", log, re.M)[0])
    assert (work / "ckpt" / f"ckpt-{first_stop}.index").exists()
    assert resumed(log) == [0, first_stop]  # a fresh start, then the resume
    # The resume found every file's count in the index the fresh start wrote beside its
    # checkpoints, so it counted nothing (a count would rewrite it; issue 20 item 4; the
    # bytes it reads: training/tests/test_record_index.py).
    assert (index.read_bytes(), index.stat().st_mtime_ns) == counted
    counts = json.loads(counted[0])["counts"]
    assert sorted(counts) == sorted(glob.glob(dataset)) and sum(counts.values()) == 512


def second_run(node: Node) -> str:
    """The local job.log from the job's second start on."""
    return agent_lines(node).split("starting job", 2)[-1] \
        if agent_lines(node).count("starting job") == 2 else ""


def resumed(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"^tpu_training resumed_from=(\d+)", log, re.M)]
