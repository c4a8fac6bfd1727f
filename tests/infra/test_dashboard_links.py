"""`tpuctl status` links each team and node to the dashboard the stacks declare (issue 46):
the dashboards' ids are fixed in their `name` (model/naming.py), so the link is known
offline, and every link `tpuctl status` prints names a dashboard some stack declares."""

from __future__ import annotations

import json
import re

import pytest
from google.cloud.monitoring_dashboard_v1.types import Dashboard

from components.stack_config import file_config
from model import monitoring as m
from model.archive import REPO_ROOT
from ops.plan.mock_engine import ProgramRun, run_program
from ops.tpu import status_views
from ops.tpu.target import load_target
from tests.repo_stacks import repo_stacks

DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
LINK = re.compile(r"https://console\.cloud\.google\.com/monitoring/dashboards/builder/"
                  r"([a-z0-9-]+)\?project=([a-z0-9-]+)(&f\.rlabel\.node_id=([a-z0-9-]+))?$")


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    return {stack: run_program(file_config(stack), stack) for stack in repo_stacks()}


def declared(runs: dict[str, ProgramRun]) -> dict[tuple[str, str], dict]:
    """(project, dashboard id) -> the dashboard message, over every stack."""
    boards = {}
    for run in runs.values():
        for resource in run.of_type(DASHBOARD):
            message = json.loads(resource.inputs["dashboardJson"])
            _, project, _, board = message["name"].split("/")
            assert project == resource.inputs["project"], message["name"]
            boards[(project, board)] = message
    return boards


def test_every_dashboard_has_a_fixed_name_in_its_own_project(runs) -> None:
    assert sorted(declared(runs)) == [
        ("acme-ml-dev", "tpu-stack-dev"), ("acme-ml-prod", "tpu-stack-prod"),
        ("acme-ml-shared", "tpu-stack-platform"),
        ("acme-ml-shared-nlp", "tpu-stack-team-nlp"),
        ("acme-ml-shared-vision", "tpu-stack-team-vision")]


def test_the_dashboards_parse_with_their_name_and_node_filter(runs) -> None:
    for message in declared(runs).values():
        parsed = Dashboard.from_json(json.dumps(message), ignore_unknown_fields=False)
        assert parsed.name == message["name"]
        [node_filter] = parsed.dashboard_filters
        assert (node_filter.label_key, node_filter.filter_type.name) == (
            "node_id", "RESOURCE_LABEL")
        assert not node_filter.template_variable  # applies to every TPU worker tile


def links(stack: str, wide: bool = False) -> list[str]:
    return [line.plain for line in status_views.dashboard_lines(load_target(stack, REPO_ROOT),
                                                                 wide)]


def test_status_links_each_team_to_a_declared_dashboard(runs) -> None:
    boards = declared(runs)
    assert links("platform") == [
        "team nlp dashboard: https://console.cloud.google.com/monitoring/dashboards/builder/"
        "tpu-stack-team-nlp?project=acme-ml-shared-nlp"]
    # vision's own stack links the dashboard its platform declares in vision's project.
    [vision] = links("team-vision")
    assert vision.endswith("builder/tpu-stack-team-vision?project=acme-ml-shared-vision")
    for stack in repo_stacks():
        for line in links(stack, wide=True):
            match = LINK.search(line)
            assert match, line
            assert (match.group(2), match.group(1)) in boards, (stack, line)


def test_wide_status_links_each_node_with_the_node_filter_set() -> None:
    target = load_target("team-vision", REPO_ROOT)
    lines = links("team-vision", wide=True)
    node_lines = [line for line in lines if line.startswith("  ")]
    assert [LINK.search(line).group(4) for line in node_lines] == [
        node.node_id for node in target.nodes]
    assert node_lines[0].startswith(f"  {target.nodes[0].node_id}: https://")


def test_a_dashboard_message_without_a_name_stays_nameless() -> None:
    assert "name" not in m.dashboard("x", m.node_charts())
    assert m.dashboard("x", [], name="projects/p/dashboards/d")["name"] == \
        "projects/p/dashboards/d"


def test_the_accelerator_metrics_resource_is_one_constant_marked_unconfirmed(runs) -> None:
    """docs/tpu-facts.md: tpu_worker or GceTpuWorker is unconfirmed for accelerator/*."""
    accelerator = [metric for metric in m.METRICS.values() if "/accelerator/" in metric.type]
    assert len(accelerator) == 5
    assert {(metric.resource, metric.confirmed) for metric in accelerator} == {
        (m.TPU_WORKER_ACCELERATOR, False)}
    assert m.TPU_WORKER_ACCELERATOR == "tpu_worker"
    assert all("GceTpuWorker" in metric.note for metric in accelerator)
    idle = m.idle_condition(60, m.project_scope("p"))
    assert m.filter_types(idle.filter) == (
        "tpu.googleapis.com/accelerator/duty_cycle", m.TPU_WORKER_ACCELERATOR)
