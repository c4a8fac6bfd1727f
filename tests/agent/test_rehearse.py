"""`tpuctl rehearse` helpers: which metadata it serves and how it shrinks the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.agent import JOB_KEY, PACKAGE_SHA256_KEY, STARTUP_SCRIPT_KEY, startup_script
from ops.local.rehearse import RehearsalError, pick_node, planned_nodes, rehearsal_job
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
