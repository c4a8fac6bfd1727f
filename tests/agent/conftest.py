"""Fixtures for the node agent's end-to-end tests: everything on loopback.

A real gcp-storage-emulator process, the loopback metadata server, the package
archive model/archive.py builds, and `.venv/image/bin/python` (TensorFlow
only) standing in for the TPU image's Python.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from model.archive import TRAINING_DIR, Archive, build_archive, pack
from node_agent.supervise import Loop
from ops.local.local_node import IMAGE_PYTHON, LocalNode, node_attributes, publish_release
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator

REPO = Path(__file__).resolve().parents[2]
TRAINING_PYTHON = REPO / ".venv" / "tf218" / "bin" / "python"
BUCKET = "tpu-stack-test"


def upload_package(gcs: StorageEmulator, archive: Archive) -> str:
    uri = f"gs://{BUCKET}/packages/{archive.filename}"
    gcs.upload(uri, archive.data)
    return uri


LOOP_END_SECONDS = 5.0  # a stopped loop ends at its next look (a second or less)


@pytest.fixture(autouse=True)
def no_agent_loop_left_running() -> Iterator[None]:
    """A test that makes an agent's supervised loops in this process stops them: one left
    running (a body patched to return None runs again at once) holds the GIL for every
    later test of the suite."""
    before = set(threading.enumerate())
    yield
    left = [thread for thread in set(threading.enumerate()) - before
            if isinstance(getattr(getattr(thread, "_target", None), "__self__", None), Loop)]
    for thread in left:
        thread.join(LOOP_END_SECONDS)
    running = sorted(thread.name for thread in left if thread.is_alive())
    assert not running, f"supervised loops left running: {running}"


@pytest.fixture(scope="session")
def gcs() -> Iterator[StorageEmulator]:
    with StorageEmulator() as emulator:
        emulator.create_bucket(BUCKET)
        yield emulator


@pytest.fixture(scope="session")
def archive() -> Archive:
    return build_archive(TRAINING_DIR)


@pytest.fixture(scope="session")
def package_uri(gcs: StorageEmulator, archive: Archive) -> str:
    return upload_package(gcs, archive)


STAND_IN = Path(__file__).resolve().parent / "stand_in"


@pytest.fixture(scope="session")
def stand_in(gcs: StorageEmulator) -> tuple[str, str]:
    """(uri, sha256) of a stand-in training package (tests/agent/stand_in: no TensorFlow)."""
    files = sorted((STAND_IN / "tpu_training").glob("*.py"))
    archive = pack([(f"tpu_training/{path.name}", path) for path in files])
    return upload_package(gcs, archive), archive.sha256


@pytest.fixture(scope="session")
def installed_package(archive: Archive, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real package installed once by the agent's own installer, for tests that
    are about what happens after the install (each node gets a copy)."""
    root = tmp_path_factory.mktemp("installed")
    code = ("import sys, pathlib; from node_agent import install; "
            "root = pathlib.Path(sys.argv[1]); "
            "(root / 'package.tar.gz').write_bytes(sys.stdin.buffer.read()); "
            "work = root / 'pkg'; install.extract(root / 'package.tar.gz', work / 'src'); "
            "install.install_wheels(work)")
    subprocess.run([str(IMAGE_PYTHON), "-c", code, str(root)], input=archive.data, check=True,
                   cwd=REPO)
    return root / "pkg"


def preinstall(node: LocalNode, package: Path, sha256: str) -> None:
    """Put an installed package where the node's agent looks for it."""
    shutil.copytree(package, node.root / "packages" / sha256, symlinks=True)


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small synthetic mnist dataset, written once by the training package."""
    out = tmp_path_factory.mktemp("mnist")
    subprocess.run([str(TRAINING_PYTHON), "-m", "tpu_training", "synth", "--model", "mnist_cnn",
                    "--out", str(out), "--examples", "512", "--shards", "2"],
                   check=True, capture_output=True, env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    return str(out / "*.tfrecord")


def job_config(dataset: str, work: Path, train_steps: int = 24) -> dict[str, object]:
    """A tiny mnist_cnn job; locations are local folders (TF's gs:// cannot reach an emulator)."""
    return {"model": "mnist_cnn", "trainData": dataset, "globalBatchSize": 16,
            "trainSteps": train_steps, "stepsPerExecution": 4, "checkpointEverySteps": 8,
            "checkpointDir": str(work / "ckpt"), "exportDir": str(work / "export"),
            "tensorboardDir": str(work / "tb")}


@dataclass
class Node(LocalNode):
    """A LocalNode whose status goes to the session's emulator."""

    gcs: StorageEmulator | None = None
    status_prefix: str = ""
    release_prefix: str = ""

    def publish(self, package_uri: str, sha256: str, job: dict[str, object]) -> str:
        """A new release for this node (contract C1): the agent picks it up by polling."""
        assert self.gcs is not None
        return publish_release(self.gcs, self.release_prefix, package_uri, sha256, job)

    def status_object(self, worker: int = 0) -> dict[str, object] | None:
        assert self.gcs is not None
        data = self.gcs.read(f"{self.status_prefix}worker-{worker}/status.json")
        return None if data is None else json.loads(data)

    def job_log(self, worker: int = 0) -> str:
        assert self.gcs is not None
        data = self.gcs.read(f"{self.status_prefix}worker-{worker}/job.log")
        return "" if data is None else data.decode()

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; guest: {self.guest}")
            time.sleep(0.2)


@pytest.fixture
def make_node(gcs: StorageEmulator, tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[Callable[..., Node]]:
    """make_node(package_uri, sha256, job, workers="all", worker=0, storage_host=None, ...):
    a node whose release prefix holds that release (none with publish=False)."""
    servers: list[MetadataServer] = []

    def make(package_uri: str, sha256: str, job: dict[str, object], *, workers: str = "all",
             worker: int = 0, storage_host: str | None = None,
             extra: dict[str, str] | None = None, env: dict[str, str] | None = None,
             publish: bool = True) -> Node:
        name = f"{request.node.name}-{len(servers)}"
        prefix = f"gs://{BUCKET}/status/{name}/"
        releases = f"gs://{BUCKET}/releases/{name}/"
        if publish:
            publish_release(gcs, releases, package_uri, sha256, job)
        attributes = node_attributes(releases, prefix, workers=workers, worker=worker,
                                     extra=extra)
        server = MetadataServer(attributes, instance_name="t1v-n-test-w-0")
        servers.append(server)
        root = tmp_path / f"node-{len(servers)}"
        env = {"TPU_STACK_RELEASE_POLL_SECONDS": "1"} | (env or {})
        return Node(server, root, storage_host or gcs.host, env_extra=env, gcs=gcs,
                    status_prefix=prefix, release_prefix=releases)

    yield make
    for server in servers:
        server.close()


def stop(process: subprocess.Popen[str]) -> None:
    """Terminate a boot left running by a failed test."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def training_copy(tmp: Path, variant: str) -> Path:
    """A copy of training/ whose archive differs (a new package version)."""
    copy = tmp / "training"
    shutil.copytree(TRAINING_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info",
                                                                          "tests"))
    (copy / "tpu_training" / "_variant.py").write_text(f'"""Package variant {variant}."""\n')
    return copy
