"""The preview's warning when a job's hang deadline cannot fit its checkpoint interval."""

from __future__ import annotations

import re
from pathlib import Path

import pulumi
import pytest

from model.progress_deadline import (
    execution_deadline_seconds,
    progress_deadline_warning,
    stack_warnings,
)
from model.settings.load import load_settings
from model.stop_save import longest_execution_seconds, stop_save_seconds
from node_agent.deadlines import STOP_SECONDS
from ops.plan.offline import offline_plan
from ops.plan.report import plain
from tests.infra.stack_fixtures import as_cli, config, job, node
from tests.repo_stacks import repo_stacks
from tpu_training.config import MAX_PROGRESS_DEADLINE_SECONDS

AGENT_EXIT_ROOM_SECONDS = 30  # after the job's kill: the agent's last status, its exit

# resnet50 at a large batch on an on-demand v5litepod-8: 200 steps would take 42 s, so
# executions fill the standard notice's share (30 s): the default deadline is 5 x 30 s.
LONG_STEPS = {"model": "resnet50", "imageSize": 224, "globalBatchSize": 4096,
              "stepsPerExecution": 200, "checkpointEverySteps": 1000}


def settings_of(provisioning: str = "on-demand", **job_changes) -> object:
    return load_settings(as_cli(config(tpu_stack_nodes=[node(provisioning=provisioning)],
                                       tpu_stack_jobs={"mnist": job(**job_changes)})), "test")


def only(settings) -> tuple:
    (n,) = settings.nodes
    return n, settings.job(n.job)


@pytest.mark.parametrize("provisioning", ["spot", "on-demand"])
def test_a_default_job_fits_its_default_interval(provisioning):
    settings = settings_of(provisioning)
    assert execution_deadline_seconds(*only(settings)) == 60  # the floor
    assert stack_warnings(settings) == []


def test_the_shipped_stacks_have_no_deadline_warning():
    for stack in repo_stacks():
        warnings = plain(offline_plan(stack).to_json())["warnings"]
        assert not [w for w in warnings if "deadline" in w], stack


def test_long_executions_make_the_default_deadline_longer_than_a_minute():
    settings = settings_of(**LONG_STEPS)
    n, j = only(settings)
    assert longest_execution_seconds(n, j) == 30.0  # the standard notice's quarter
    assert execution_deadline_seconds(n, j) == 150.0
    assert stack_warnings(settings) == [
        "node trainer: job mnist's deadline for an execution without progress is 150 s (the "
        "agent's default: 5 x its longest execution of about 30.0 s, at least 60 s), longer "
        "than its checkpoint interval of 60 s (checkpointEveryMinutes), so a hang would "
        "always lose more than one interval (up to 210 s); give progressDeadlineSeconds of "
        "at most 60 s (above the longest execution), or fewer stepsPerExecution"]
    # Checkpointing by time less often, or a deadline of its own, fits.
    assert stack_warnings(settings_of(**LONG_STEPS, checkpointEveryMinutes=3)) == []
    assert stack_warnings(settings_of(**LONG_STEPS, progressDeadlineSeconds=55)) == []


def test_a_given_deadline_is_the_execution_deadline_and_is_checked_both_ways():
    n, j = only(settings_of(progressDeadlineSeconds=90, checkpointEveryMinutes=1))
    assert execution_deadline_seconds(n, j) == 90
    assert "is 90 s (progressDeadlineSeconds), longer than its checkpoint interval of 60 s" \
        in progress_deadline_warning(n, j)
    short = settings_of(**LONG_STEPS, progressDeadlineSeconds=20)
    (warning,) = stack_warnings(short)
    assert warning == (
        "node trainer: job mnist's progressDeadlineSeconds (20 s) is shorter than its "
        "longest execution (about 30.0 s): the agent would stop a healthy job as hung; give "
        "more, up to the 120 s the key allows, or leave it unset (the agent's default: 5 "
        "times the longest execution), or fewer stepsPerExecution")  # 5 x 30 s is over 120 s
    n, j = only(settings_of(**{**LONG_STEPS, "stepsPerExecution": 100},
                            progressDeadlineSeconds=10))
    assert 10 < longest_execution_seconds(n, j) < 24  # 5 x it fits the bound
    assert progress_deadline_warning(n, j).endswith("; give at least 5 times that")


def test_a_given_deadline_under_the_stop_save_is_warned_of():
    n, j = only(settings_of(widthMultiplier=4, progressDeadlineSeconds=15))  # 4.6 GiB saves
    stop = longest_execution_seconds(n, j) + stop_save_seconds(j)
    assert 15 < stop < 60
    assert progress_deadline_warning(n, j) == (
        f"node trainer: job mnist's progressDeadlineSeconds (15 s) also bounds its stop, "
        f"which takes about {stop:.0f} s (an execution, then the save): the agent would "
        f"kill the job before its stop save is written")
    assert stack_warnings(settings_of(widthMultiplier=4, progressDeadlineSeconds=60)) == []


def test_the_preview_warns_on_the_node_and_the_plan_lists_it(monkeypatch):
    warned = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, resource=None, **_: warned.append(
        (message, type(resource).__name__)))
    plan = plain(offline_plan("test", as_cli(config(
        tpu_stack_jobs={"mnist": job(progressDeadlineSeconds=120)}))).to_json())
    (warning,) = [w for w in plan["warnings"] if "deadline" in w]
    assert warning.startswith("node trainer: job mnist's deadline for an execution without "
                              "progress is 120 s (progressDeadlineSeconds)")
    assert (warning, "TpuNode") in warned


def test_a_bad_deadline_is_one_message_naming_the_key():
    with pytest.raises(Exception) as caught:
        settings_of(progressDeadlineSeconds=5)
    assert "tpu-stack:jobs.mnist.progressDeadlineSeconds: must be a number of seconds from " \
           "10 to 120 (it also bounds" in str(caught.value)
    with pytest.raises(Exception) as caught:
        settings_of(progressDeadlineSeconds=600)
    assert "progressDeadlineSeconds: must be a number of seconds from 10 to 120" \
        in str(caught.value)


def test_the_largest_deadline_and_so_stop_ends_inside_the_units_stop_timeout():
    """progressDeadlineSeconds is also the agent's stop deadline (SIGTERM to SIGKILL):
    systemd kills the whole unit TimeoutStopSec after its stop began, so the largest one
    must end inside it with room for the agent's own exit."""
    unit = (Path(__file__).parents[2] / "node_agent" / "bootstrap.sh").read_text()
    (timeout,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    assert int(timeout) >= MAX_PROGRESS_DEADLINE_SECONDS + AGENT_EXIT_ROOM_SECONDS
    assert MAX_PROGRESS_DEADLINE_SECONDS <= STOP_SECONDS  # no longer than the default stop
