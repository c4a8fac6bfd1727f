"""tpuctl status reads every node's job status from one listing of the logs bucket."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from node_agent.contract import STATUS_KEY
from ops.local.storage_emulator import StorageEmulator
from ops.tpu.api import TpuApi
from ops.tpu.logs import AgentLogs
from ops.tpu.status import collect
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import PROJECT, STACK_LABELS, ZONE, expected_node, target

BUCKET = "acme-ml-dev-logs"


@pytest.fixture(scope="module")
def emulator() -> Iterator[StorageEmulator]:
    with StorageEmulator() as running:
        running.create_bucket(BUCKET)
        yield running


@pytest.fixture
def logs(emulator: StorageEmulator, monkeypatch: pytest.MonkeyPatch) -> AgentLogs:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.host)
    return AgentLogs(PROJECT)


def publish_status(logs: AgentLogs, node_id: str, worker: int, fields: dict[str, str]) -> None:
    """status.json as the agent uploads it: the fields as content and as custom metadata."""
    blob = logs.client.bucket(BUCKET).blob(f"status/{node_id}/worker-{worker}/status.json")
    blob.metadata = fields
    blob.upload_from_string(json.dumps(fields), content_type="application/json")


def add_node(fake: FakeTpuApi, node_id: str, *states: str) -> None:
    metadata = {STATUS_KEY: f"gs://{BUCKET}/status/{node_id}/"}
    fake.add_node(ZONE, node_id, *states, labels=STACK_LABELS, metadata=metadata)


def test_status_comes_from_one_listing_and_guest_attributes_only_where_it_lacks(
    fake_tpu: FakeTpuApi, tpu: TpuApi, logs: AgentLogs
) -> None:
    for node_id in ("dev-a", "dev-b", "dev-old"):
        add_node(fake_tpu, node_id)
    publish_status(logs, "dev-a", 0, {"state": "running", "step": "700", "goodput": "{}"})
    publish_status(logs, "dev-a", 1, {"state": "idle"})
    publish_status(logs, "dev-b", 0, {"state": "succeeded", "step": "900", "noise": "x"})
    # An agent that publishes no object metadata yet: its guest attributes are asked.
    fake_tpu.set_guest_attributes(ZONE, "dev-old", 0, {"state": "retrying", "step": "3"})
    stack = target(*(expected_node(n) for n in ("dev-a", "dev-b", "dev-old")))

    jobs = {node.node_id: node.job for node in collect(tpu, stack, logs)}

    assert jobs == {
        "dev-a": {"state": "running", "step": "700", "goodput": "{}"},
        "dev-b": {"state": "succeeded", "step": "900"},
        "dev-old": {"state": "retrying", "step": "3"},
    }
    assert fake_tpu.count("getGuestAttributes") == 1
    assert fake_tpu.count("list") == 1


def test_a_node_that_is_not_ready_gets_no_job_status_from_the_listing(
    fake_tpu: FakeTpuApi, tpu: TpuApi, logs: AgentLogs
) -> None:
    add_node(fake_tpu, "dev-p", "PREEMPTED")
    publish_status(logs, "dev-p", 0, {"state": "running", "step": "5"})

    [node] = collect(tpu, target(expected_node("dev-p")), logs)

    assert (node.state, node.job) == ("PREEMPTED", {})


def test_a_bucket_that_cannot_be_listed_falls_back_to_guest_attributes(
    fake_tpu: FakeTpuApi, tpu: TpuApi, logs: AgentLogs
) -> None:
    fake_tpu.add_node(ZONE, "dev-c", labels=STACK_LABELS,
                      metadata={STATUS_KEY: "gs://no-such-bucket/status/dev-c/"})
    fake_tpu.set_guest_attributes(ZONE, "dev-c", 0, {"state": "running"})

    [node] = collect(tpu, target(expected_node("dev-c")), logs)

    assert node.job == {"state": "running"}
