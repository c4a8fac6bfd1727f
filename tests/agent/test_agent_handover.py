"""The agent keeps every save through its own updates (issue 39): a hand-over as a
transaction, status uploads off the job's path, releases that come back.

Real agent (the zipapp, as the systemd unit runs it), GCS emulator (behind a proxy that
stalls uploads where the test says) and metadata server; the stand-in job of
tests/agent/stand_in, which trains a step every `stepSeconds` and saves on SIGTERM.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node_agent import build, handover
from node_agent.contract import STARTUP_SCRIPT_KEY
from ops.local.local_node import IMAGE_PYTHON
from ops.local.storage_emulator import StorageEmulator
from tests.agent.conftest import Node
from tests.agent.test_agent_chaos import (
    agent_health,
    agent_variant,
    lines,
    stand_in_package,
    training,
)
from tests.fakes.fault_proxy import FaultProxy

EXIT_PREEMPTED = 75
UPLOAD_STALL_SECONDS = 90.0  # longer than the execution deadline's 60 s floor
UPLOADS = "/upload/storage/"  # the JSON API's upload path: status.json and job.log


class Service:
    """`agent.pyz run --stay` as the unit runs it, its output in a file."""

    def __init__(self, node: Node, tmp_path: Path):
        self.file = tmp_path / "agent.pyz"
        self.file.write_bytes(build.zipapp())
        self.output = tmp_path / f"agent-{time.monotonic_ns()}.out"
        with self.output.open("w") as out:
            self.process = subprocess.Popen(
                [str(IMAGE_PYTHON), str(self.file), "run", "--stay"], env=node.env,
                stdout=out, stderr=subprocess.STDOUT)

    def stop(self, timeout: float = 120) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def service() -> Iterator[Callable[[Node, Path], Service]]:
    started: list[Service] = []

    def start(node: Node, tmp_path: Path) -> Service:
        started.append(Service(node, tmp_path))
        return started[-1]

    yield start
    for each in started:
        each.close()


def agent_broken_at_import() -> bytes:
    """This checkout's agent with node_agent/agent.py raising at import."""
    source = zipfile.ZipFile(io.BytesIO(build.zipapp()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as broken:
        for name in source.namelist():
            data = source.read(name)
            if name == "node_agent/agent.py":
                data += b"\nraise RuntimeError('this agent is broken')\n"
            broken.writestr(name, data)
    return out.getvalue()


def job_pids(out: Path) -> list[str]:
    return Path(f"{out}.pids").read_text().split()


def test_a_stalled_gcs_neither_hangs_the_job_nor_loses_a_stop_during_a_hand_over(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path,
        service: Callable[[Node, Path], Service]) -> None:
    uri, sha = stand_in_package(gcs, tmp_path, "stalled")
    out = tmp_path / "steps"
    with FaultProxy(gcs.host, stall={UPLOADS: UPLOAD_STALL_SECONDS}) as proxy:
        node = make_node(uri, sha, training(out) | {"stepSeconds": 1.0},
                         storage_host=proxy.host)
        agent = service(node, tmp_path)
        node.wait_for(lambda: proxy.stalled >= 1, "a status upload to stall")
        stalled_at = time.monotonic()
        states = set()
        # A step a second; every upload held for 90 s: the reader and the main loop
        # must not wait for them (the execution deadline's floor is 60 s).
        while time.monotonic() - stalled_at < UPLOAD_STALL_SECONDS + 5:
            states.add(node.guest.get("state"))
            time.sleep(0.5)
        assert "hung" not in states, node.job_log_path().read_text()
        assert int(node.guest["step"]) >= 60
        # A new agent arrives while uploads still stall; the VM is stopped mid-hand-over.
        new_agent = agent_variant("stalled")
        node.metadata.set_attributes({STARTUP_SCRIPT_KEY: build.startup_script(new_agent)})
        node.wait_for(lambda: "hands over to agent" in node.job_log_path().read_text(),
                      "the hand-over to begin")
        code = agent.stop()

    log = node.job_log_path().read_text()
    output = agent.output.read_text()
    assert code == EXIT_PREEMPTED, output
    assert "no progress line" not in log
    assert len(job_pids(out)) == 1  # one job from start to stop
    assert lines(r"^tpu_training stopped_at=(\d+)", log) == [int(out.read_text())]
    assert node.guest["state"] == "preempted"
    assert "Traceback" not in output, output


def test_a_hand_over_to_an_agent_that_raises_at_import_keeps_the_job_with_this_agent(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path,
        service: Callable[[Node, Path], Service]) -> None:
    uri, sha = stand_in_package(gcs, tmp_path, "broken-agent")
    out = tmp_path / "steps"
    node = make_node(uri, sha, training(out))
    agent = service(node, tmp_path)
    node.wait_for(lambda: int(node.guest.get("step", 0)) >= 3, "training")
    own = agent.file.read_bytes()
    broken = agent_broken_at_import()
    node.metadata.set_attributes({STARTUP_SCRIPT_KEY: build.startup_script(broken)})
    node.wait_for(lambda: "refused" in node.job_log_path().read_text(),
                  "the new agent to be refused")
    step = int(node.guest["step"])
    node.wait_for(lambda: int(node.guest.get("step", 0)) >= step + 3,
                  "this agent to follow the job on")
    node.metadata.preempt()
    node.wait_for(lambda: node.guest.get("state") == "preempted", "the stop save")
    code = agent.stop()

    log = node.job_log_path().read_text()
    assert code == EXIT_PREEMPTED, agent.output.read_text()
    assert agent_health(node)["version"] == handover.version_of(own)
    assert agent.file.read_bytes() == own  # a restart runs this agent, not the broken one
    assert (node.root / handover.REFUSED_FILE).read_text().split() == [
        handover.version_of(broken)]
    assert log.count("refused (exit code 1") == 1  # tried once, never again
    assert len(job_pids(out)) == 1
    assert lines(r"^tpu_training stopped_at=(\d+)", log) == [int(out.read_text())]


def test_publishing_releases_a_b_c_then_a_again_runs_a(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path,
        service: Callable[[Node, Path], Service]) -> None:
    packages = {name: stand_in_package(gcs, tmp_path, name) for name in "ABC"}
    out = tmp_path / "steps"
    node = make_node(*packages["A"], training(out))
    agent = service(node, tmp_path)
    for name in "ABCA":
        uri, sha = packages[name]
        if name != "A" or node.guest.get("package") == packages["C"][1]:
            node.publish(uri, sha, training(out))
        node.wait_for(lambda sha=sha: node.guest.get("package") == sha and
                      node.guest.get("state") == "running", f"release {name} to run")
        step = int(node.guest.get("step", 0))
        node.wait_for(lambda step=step: int(node.guest.get("step", 0)) >= step + 2,
                      f"release {name}'s job to train")
    assert agent.stop() == EXIT_PREEMPTED, agent.output.read_text()
    # A's package was pruned while B and C ran; it was installed again.
    assert node.job_log_path().read_text().count("starting job") == 4
    assert node.guest["state"] == "preempted"


def test_a_job_that_lost_its_agent_trains_on_and_the_next_agent_stops_it_with_a_save(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path,
        service: Callable[[Node, Path], Service]) -> None:
    uri, sha = stand_in_package(gcs, tmp_path, "orphan")
    out = tmp_path / "steps"
    node = make_node(uri, sha, training(out))
    first = service(node, tmp_path)
    node.wait_for(lambda: int(node.guest.get("step", 0)) >= 3, "training")
    stale = int((node.root / "run" / "job.pid").read_text().split()[0])
    first.process.kill()  # the agent dies (a crash, an OOM kill); its job's pipe breaks
    first.process.wait()
    orphan_log = node.root / "run" / "job-output.log"
    node.wait_for(lambda: orphan_log.exists() and "tpu_training step=" in
                  orphan_log.read_text().partition("output_orphaned")[2],
                  "the job to train on, its lines in its own log")
    second = service(node, tmp_path)
    node.wait_for(lambda: len(job_pids(out)) == 2 and node.guest.get("state") == "running",
                  "the next agent's job")
    assert second.stop() == EXIT_PREEMPTED, second.output.read_text()

    log = node.job_log_path().read_text()
    assert f"stopping job pid {stale} left by an earlier agent" in second.output.read_text()
    orphan_stop, last_stop = lines(r"^tpu_training stopped_at=(\d+)", log)
    assert f"after losing it; it saved step {orphan_stop}" in log
    assert lines(r"^tpu_training resumed_from=(\d+)", log)[-1] == orphan_stop  # nothing lost
    assert last_stop == int(out.read_text())


def test_an_agent_that_does_not_import_falls_back_to_the_one_before_it(tmp_path: Path) -> None:
    good, broken = build.zipapp(), agent_broken_at_import()
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(broken)  # as the bootstrap writes it, the previous one kept beside
    (tmp_path / handover.PREVIOUS_NAME).write_bytes(good)
    root = tmp_path / "root"
    env = os.environ | {"TPU_STACK_ROOT": str(root), "GCE_METADATA_HOST": "127.0.0.1:9"}
    process = subprocess.Popen([str(IMAGE_PYTHON), str(agent), "run", "--stay"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while agent.read_bytes() != good and time.monotonic() < deadline:
            time.sleep(0.1)
        assert agent.read_bytes() == good  # a restart runs the previous agent, no loop
        refused = root / handover.REFUSED_FILE
        assert refused.read_text().split() == [handover.version_of(broken)]
        time.sleep(1)  # the previous agent is up: it waits for its metadata server
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert "falling back to the previous one" in output
    assert process.returncode == EXIT_PREEMPTED, output
