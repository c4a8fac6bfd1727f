"""The preview's warning when a node's stop save may not fit in its stop notice."""

from __future__ import annotations

import pulumi
import pytest

from model import catalog
from model.settings.load import load_settings
from model.stop_save import (
    longest_execution_seconds,
    stack_warnings,
    step_seconds,
    stop_save_seconds,
    stop_save_warning,
    worst_stop_seconds,
)
from ops.plan.offline import offline_plan
from ops.plan.report import plain, render
from tests.infra.stack_fixtures import as_cli, config, job, node
from tpu_training.config import JobConfig

WIDE_MNIST = {"widthMultiplier": 4}  # 16x the trunk: about 4.6 GiB a checkpoint


def settings_of(provisioning: str, **job_changes) -> object:
    return load_settings(as_cli(config(tpu_stack_nodes=[node(provisioning=provisioning)],
                                       tpu_stack_jobs={"mnist": job(**job_changes)})), "test")


def test_the_notice_follows_the_provisioning():
    assert catalog.stop_notice_seconds(spot=True) == 30
    assert catalog.stop_notice_seconds(spot=False) == 120


@pytest.mark.parametrize("provisioning", ["spot", "preemptible", "on-demand", "reserved"])
@pytest.mark.parametrize("model", ["mnist_cnn", "resnet18", "resnet50"])
def test_the_shipped_models_fit_every_notice(provisioning, model):
    extra = {"imageSize": 224} if model != "mnist_cnn" else {}
    assert stack_warnings(settings_of(provisioning, model=model, **extra)) == []


def test_a_wide_model_on_a_spot_node_is_warned_of():
    settings = settings_of("spot", **WIDE_MNIST)
    (node,), job_ = settings.nodes, settings.job("mnist")
    seconds = stop_save_seconds(job_)
    execution = longest_execution_seconds(node, job_)
    # Over 3/4 of 30 s, within 3/4 of 120 s: the execution, a save in flight, the stop save.
    assert worst_stop_seconds(node, job_) == execution + 2 * seconds
    assert 22.5 < execution + 2 * seconds < 90
    assert stack_warnings(settings) == [
        f"node trainer: a checkpoint of job mnist (mnist_cnn) is about 4,684 MiB, about "
        f"{seconds:.0f} s to GCS at 200 MiB/s; a stop may take an execution of up to "
        f"{execution:.1f} s, an interval save still being written and the stop save "
        f"({execution + 2 * seconds:.0f} s); a spot node's stop notice is 30 s and the stop "
        f"should fit in 22.5 s, so a preemption may lose the work since the last periodic "
        f"checkpoint (checkpointEveryMinutes bounds it)"]


def test_a_save_in_flight_is_counted_in_the_stop():
    # A checkpoint whose one save fits the spot budget beside the execution, but whose
    # save in flight plus the stop save do not: warned of (one save alone would not be).
    settings = settings_of("spot", widthMultiplier=3)
    (node,), job_ = settings.nodes, settings.job("mnist")
    execution, seconds = longest_execution_seconds(node, job_), stop_save_seconds(job_)
    assert execution + seconds <= 22.5 < execution + 2 * seconds
    (warning,) = stack_warnings(settings)
    assert "an interval save still being written and the stop save" in warning


def test_the_longest_execution_is_the_notices_share_unless_a_step_is_longer():
    settings = settings_of("spot", model="resnet50", imageSize=224, globalBatchSize=16384,
                           stepsPerExecution=100, checkpointEverySteps=1000)
    (node,), job_ = settings.nodes, settings.job("mnist")
    step = step_seconds(node, job_)
    peak = catalog.PEAK_BF16_FLOPS_PER_CHIP[node.tpu.generation.name] * node.tpu.chips
    assert step == pytest.approx(16384 * 6 * 4_089_184_256 / (peak * 0.3))
    assert 100 * step > 7.5  # 100 steps would outlast the spot notice's share ...
    assert longest_execution_seconds(node, job_) == 7.5  # ... which the job keeps to
    assert stack_warnings(settings) == []
    huge = settings_of("spot", model="resnet50", imageSize=224, globalBatchSize=2**20,
                       stepsPerExecution=1, checkpointEverySteps=1)
    (node,), job_ = huge.nodes, huge.job("mnist")
    assert longest_execution_seconds(node, job_) == step_seconds(node, job_) > 22.5
    (warning,) = stack_warnings(huge)  # a step cannot be split
    assert f"a stop may take an execution of up to {step_seconds(node, job_):.1f} s" in warning


def test_the_same_model_on_a_standard_node_fits():
    assert stack_warnings(settings_of("on-demand", **WIDE_MNIST)) == []


def test_a_queued_spot_node_has_the_spot_notice():
    settings = load_settings(as_cli(config(
        tpu_stack_nodes=[node(provisioning="queued", queue={"spot": True})],
        tpu_stack_jobs={"mnist": job(**WIDE_MNIST)})), "test")
    (queued,) = settings.nodes
    assert stop_save_warning(queued, settings.job("mnist")) is not None


def test_the_preview_warns_and_the_plan_report_shows_it(monkeypatch):
    warned = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, resource=None, **_: warned.append(
        (message, type(resource).__name__)))
    plan = plain(offline_plan("test", as_cli(config(
        tpu_stack_jobs={"mnist": job(**WIDE_MNIST)}))).to_json())
    (warning,) = plan["warnings"]
    assert warning.startswith("node trainer: a checkpoint of job mnist (mnist_cnn) is about ")
    assert (warning, "TpuNode") in warned
    assert f"> [!WARNING]\n> {warning}" in render(plan, "markdown")
    assert f"WARNING: {warning}" in render(plan, "table")


def test_a_plan_without_warnings_shows_none():
    plan = plain(offline_plan("test", as_cli(config())).to_json())
    assert plan["warnings"] == []
    assert "WARNING" not in render(plan, "markdown")


def test_the_estimate_is_the_schema_table_at_the_write_rate():
    mnist = JobConfig("mnist_cnn", "x", 8, 8)
    assert stop_save_seconds(mnist) == pytest.approx(307_011_058 / (200 * 2**20), rel=1e-4)
