"""tpuctl logs: the agent's job.log and status.json from a GCS emulator."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ops.local.storage_emulator import StorageEmulator
from ops.tpu.api import NodeStatus
from ops.tpu.logs import AgentLogs, LogsError, follow, status_prefix
from tests.ops.tpu_world import PROJECT

PREFIX = "gs://acme-ml-dev-logs/status/dev-trainer/"


@pytest.fixture(scope="module")
def emulator() -> Iterator[StorageEmulator]:
    with StorageEmulator() as running:
        running.create_bucket("acme-ml-dev-logs")
        yield running


@pytest.fixture
def logs(emulator: StorageEmulator, monkeypatch: pytest.MonkeyPatch) -> AgentLogs:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
    return AgentLogs(PROJECT)


def publish(emulator: StorageEmulator, worker: int, log: str, state: str) -> None:
    emulator.upload(f"{PREFIX}worker-{worker}/job.log", log.encode())
    emulator.upload(f"{PREFIX}worker-{worker}/status.json", json.dumps({"state": state}).encode())


def test_reads_one_workers_log_and_status(emulator: StorageEmulator, logs: AgentLogs) -> None:
    publish(emulator, 1, "step 100 loss 0.5\n", "running")

    assert logs.job_log(PREFIX, 1) == b"step 100 loss 0.5\n"
    assert logs.status(PREFIX, 1) == {"state": "running"}
    assert logs.job_log(PREFIX, 7) is None


def test_follow_prints_only_new_text_until_the_job_ends(
    emulator: StorageEmulator, logs: AgentLogs
) -> None:
    publish(emulator, 0, "installing\n", "installing")
    uploads = iter(
        [("installing\nstep 1\n", "running"), ("installing\nstep 1\nstep 2\ndone\n", "succeeded")]
    )
    printed: list[str] = []

    def next_upload(_seconds: float) -> None:
        upload = next(uploads, None)
        if upload:
            publish(emulator, 0, *upload)

    state = follow(logs, PREFIX, 0, printed.append, poll=0, sleep=next_upload)

    assert state == "succeeded"
    assert "".join(printed) == "installing\nstep 1\nstep 2\ndone\n"
    assert printed[0] == "installing\n"


def test_a_node_without_status_metadata_is_one_clear_error() -> None:
    node = NodeStatus("z", "dev-x", "READY", "", "v2-8", "r", False, {}, {}, "")

    with pytest.raises(LogsError, match="node dev-x has no tpu-stack-status metadata"):
        status_prefix(node)
