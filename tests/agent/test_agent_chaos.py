"""The agent under faults, across installs and across a new agent (issue 27).

Real agent (the zipapp), GCS emulator and metadata server, each behind a proxy that
breaks answers at random (seeded: tests/fakes/fault_proxy.py); the real job for the
boot with an update, the stand-in of tests/agent/stand_in where only the agent's
behaviour matters.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from model.archive import Archive, build_archive, pack
from node_agent import build, handover
from node_agent.contract import STARTUP_SCRIPT_KEY
from ops.local.local_node import IMAGE_PYTHON
from ops.local.storage_emulator import StorageEmulator
from ops.rehearse.rehearsal import SYSTEMCTL
from tests.agent.conftest import (
    STAND_IN,
    Node,
    job_config,
    stop,
    training_copy,
    upload_package,
)
from tests.fakes.fault_proxy import CHAOS_KINDS, Chaos, FaultProxy

EXIT_PREEMPTED = 75


def behind_proxies(node: Node, gcs: FaultProxy, metadata: FaultProxy) -> None:
    node.storage_host = gcs.host
    node.env_extra["GCE_METADATA_HOST"] = metadata.address


def agent_health(node: Node) -> dict[str, object]:
    return json.loads(node.guest.get("agent", "{}"))


def lines(pattern: str, log: str) -> list[int]:
    return [int(n) for n in re.findall(pattern, log, re.M)]


def test_a_boot_and_a_hot_update_survive_broken_answers_from_every_server(
        make_node: Callable[..., Node], archive: Archive, package_uri: str, dataset: str,
        gcs: StorageEmulator, tmp_path: Path) -> None:
    work = tmp_path / "job"
    node = make_node(package_uri, archive.sha256, job_config(dataset, work, 40))
    new = build_archive(training_copy(tmp_path, "chaos"))
    new_uri = upload_package(gcs, new)
    with FaultProxy(gcs.host, chaos=Chaos(seed=27, rate=0.2)) as storage_faults, \
            FaultProxy(node.metadata.host, chaos=Chaos(seed=31, rate=0.2)) as metadata_faults:
        behind_proxies(node, storage_faults, metadata_faults)
        boot = node.start()
        try:
            node.wait_for(lambda: int(node.guest.get("step", 0)) >= 8, "training past step 8",
                          timeout=300)
            job_pid = int((node.root / "run" / "job.pid").read_text().split()[0])
            os.kill(job_pid, signal.SIGSTOP)  # the update lands mid-training
            node.publish(new_uri, new.sha256, job_config(dataset, work, 40))
            node.wait_for(lambda: new.sha256 in node.installed_packages(), "the new package",
                          timeout=300)
            os.kill(job_pid, signal.SIGCONT)
            output, _ = boot.communicate(timeout=400)
        finally:
            stop(boot)

    assert boot.returncode == 0, output
    # Every kind of fault reached the agent from both servers.
    assert set(storage_faults.chaos_sent) == set(CHAOS_KINDS), storage_faults.chaos_sent
    assert set(metadata_faults.chaos_sent) == set(CHAOS_KINDS), metadata_faults.chaos_sent
    assert node.guest["state"] == "succeeded"
    assert node.guest["package"] == new.sha256
    log = node.job_log_path().read_text()
    before, after = log.split(f"starting job: package {new.sha256}")
    assert "update installed: stopping the job so it checkpoints" in before
    (stopped_at,) = lines(r"^tpu_training stopped_at=(\d+)", before)
    assert lines(r"^tpu_training resumed_from=(\d+)", after) == [stopped_at]  # nothing lost
    assert "tpu_training step=40" in after
    # No loop of the agent raised, none had to be restarted, nothing escaped a thread.
    health = agent_health(node)
    assert health["threadFaults"] == 0 and health["threadRestarts"] == 0, health
    assert "Traceback" not in output and "Exception in thread" not in output, output


def stand_in_package(gcs: StorageEmulator, tmp_path: Path, variant: str) -> tuple[str, str]:
    """(uri, sha256) of the stand-in job, made a different package by `variant`."""
    extra = tmp_path / f"variant-{variant}.py"
    extra.write_text(f'"""Stand-in variant {variant}."""\n')
    files = [(f"tpu_training/{path.name}", path)
             for path in sorted((STAND_IN / "tpu_training").glob("*.py"))]
    archive = pack([*files, ("tpu_training/_variant.py", extra)])
    return upload_package(gcs, archive), archive.sha256


def training(out: Path, steps: int = 100_000) -> dict[str, object]:
    return {"standIn": "train", "out": str(out), "steps": steps, "stepSeconds": 0.2}


def test_an_install_stuck_longer_than_the_notice_does_not_delay_the_stop(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path) -> None:
    old_uri, old_sha = stand_in_package(gcs, tmp_path, "old")
    new_uri, new_sha = stand_in_package(gcs, tmp_path, "new")
    out = tmp_path / "steps"
    stuck = new_uri.rsplit("/", 1)[1]
    with FaultProxy(gcs.host, stall={stuck: 300}) as proxy:  # ten times a spot notice
        node = make_node(old_uri, old_sha, training(out), storage_host=proxy.host)
        boot = node.start()
        try:
            node.wait_for(lambda: int(node.guest.get("step", 0)) >= 3, "training")
            node.publish(new_uri, new_sha, training(out))
            node.wait_for(lambda: proxy.stalled >= 1, "the new package's download to hang")
            time.sleep(1)
            noticed = time.monotonic()
            node.metadata.preempt()
            output, _ = boot.communicate(timeout=120)
            stopped_in = time.monotonic() - noticed
        finally:
            stop(boot)

    assert boot.returncode == EXIT_PREEMPTED, output
    assert stopped_in < 30, output  # a spot VM's notice; the stand-in stops in about 1 s
    assert node.guest["state"] == "preempted"
    assert node.status_object()["stopSave"]["step"] == int(out.read_text())
    assert new_sha not in node.installed_packages()  # still hanging when the node stopped


def agent_variant(tag: str) -> bytes:
    """This checkout's agent zipapp with one more file: another agent version."""
    data = io.BytesIO(build.zipapp())
    with zipfile.ZipFile(data, "a") as archive:
        archive.writestr("node_agent/_variant.py", f'"""Agent variant {tag}."""\n')
    return data.getvalue()


def test_a_new_agent_takes_over_the_running_job_and_its_notices(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path) -> None:
    uri, sha = stand_in_package(gcs, tmp_path, "takeover")
    out = tmp_path / "steps"
    node = make_node(uri, sha, training(out))
    agent = tmp_path / "agent.pyz"  # the agent as the systemd unit runs it
    agent.write_bytes(build.zipapp())
    service = subprocess.Popen([str(IMAGE_PYTHON), str(agent), "run", "--stay"], env=node.env,
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    new_agent = agent_variant("v2")
    try:
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 3, "training")
        assert agent_health(node)["version"] == handover.version_of(build.zipapp())
        # A metadata change (a new agent in the startup script) reruns no script: the
        # running agent sees it and hands over to it, in place.
        node.metadata.set_attributes({STARTUP_SCRIPT_KEY: build.startup_script(new_agent)})
        node.wait_for(lambda: agent_health(node).get("version") ==
                      handover.version_of(new_agent), "the new agent to take over")
        step = int(node.guest["step"])
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= step + 3,
                      "the new agent to follow the job's steps")
        node.metadata.preempt()
        node.wait_for(lambda: node.guest.get("state") == "preempted", "the stop save")
        service.send_signal(signal.SIGTERM)  # then the VM goes down, as systemd stops it
        output, _ = service.communicate(timeout=120)
    finally:
        stop(service)

    assert service.returncode == EXIT_PREEMPTED, output
    assert agent.read_bytes() == new_agent
    pids = (tmp_path / "steps.pids").read_text().split()
    assert len(pids) == 1  # one job process from start to stop: never restarted
    log = node.job_log_path().read_text()
    assert f"(job pid {pids[0]} keeps running)" in log
    assert f"took over job pid {pids[0]} from agent {handover.version_of(build.zipapp())}" in log
    assert node.guest["state"] == "preempted"
    assert node.status_object()["stopSave"]["step"] == int(out.read_text())
    assert lines(r"^tpu_training stopped_at=(\d+)", log) == [int(out.read_text())]
    assert "Traceback" not in output, output


def test_a_stop_during_the_jobs_start_up_is_a_clean_stop(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "started"
    node = make_node(*stand_in, {"standIn": "slow-start", "out": str(out)})
    boot = node.start()
    try:
        node.wait_for(out.exists, "the job to start")
        node.metadata.preempt()
        output, _ = boot.communicate(timeout=120)
    finally:
        stop(boot)

    # Killed by SIGTERM before it could handle it: it had not trained, nothing is lost.
    assert boot.returncode == EXIT_PREEMPTED, output
    assert node.guest["state"] == "preempted"
    assert "during the job's start-up, before it trained: resumes from step 0" in \
        node.guest["message"]


def test_a_rerun_of_the_startup_script_with_a_new_agent_reloads_the_service_in_place(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path) -> None:
    uri, sha = stand_in_package(gcs, tmp_path, "reload")
    out = tmp_path / "steps"
    node = make_node(uri, sha, training(out))
    bin_dir, units = tmp_path / "bin", tmp_path / "units"
    for folder in (bin_dir, units):
        folder.mkdir()
    (bin_dir / "systemctl").write_text(SYSTEMCTL)  # the stand-in for systemd
    (bin_dir / "systemctl").chmod(0o755)
    node.env_extra |= {"TPU_STACK_INIT": "systemd", "TPU_STACK_UNIT_DIR": str(units),
                       "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    # The unit's agent: `systemctl enable --now` (a child of the bootstrap) execs it.
    service = node.start(start_new_session=True)
    new_agent = agent_variant("reload")
    try:
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 3, "training")
        script = tmp_path / "new-startup-script.sh"
        script.write_text(build.startup_script(new_agent))
        rerun = subprocess.run(["bash", str(script)], env=node.env, capture_output=True,
                               text=True, timeout=60, check=False)
        node.wait_for(lambda: agent_health(node).get("version") ==
                      handover.version_of(new_agent), "the reloaded agent")
        node.metadata.preempt()
        node.wait_for(lambda: node.guest.get("state") == "preempted", "the stop save")
        os.killpg(service.pid, signal.SIGTERM)  # the VM goes down
        output, _ = service.communicate(timeout=120)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)

    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert (node.root / "agent.pyz").read_bytes() == new_agent
    log = node.job_log_path().read_text()
    assert f"hands over to agent {handover.version_of(new_agent)}" in log, output
    assert len((tmp_path / "steps.pids").read_text().split()) == 1  # the job was kept
    assert node.status_object()["stopSave"]["step"] == int(out.read_text())
