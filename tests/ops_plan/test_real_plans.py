"""Plan diff, report and policy pack on real offline plans of the repository's stacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from components.stack_config import file_config, stack_names
from ops.plan import offline_plan
from ops.plan_diff import diff_plans, render_diff
from ops.plan_report import plain
from policy.evaluate import evaluate, load_config

V2VM = "gcp:tpu/v2Vm:V2Vm"
Nodes = list[dict[str, Any]]


def plan_with_nodes(stack: str, edit: Callable[[Nodes], None]) -> dict[str, Any]:
    """The stack's offline plan after `edit` changed its `tpu-stack:nodes`."""
    config = file_config(stack)
    nodes = json.loads(config["tpu-stack:nodes"])
    edit(nodes)
    config["tpu-stack:nodes"] = json.dumps(nodes)
    return plain(offline_plan(stack, config).to_json())


@pytest.fixture(scope="module")
def plans() -> dict[str, dict[str, Any]]:
    return {stack: plain(offline_plan(stack).to_json()) for stack in stack_names()}


def test_every_stack_passes_the_pack(plans):
    assert set(plans) >= {"dev", "prod"}
    for stack, plan in plans.items():
        assert evaluate(plan, load_config()) == [], stack


def test_runtime_version_change_warns_of_replacement(plans):
    head = plan_with_nodes("dev", lambda n: n[0].update(runtimeVersion="tpu-vm-tf-2.19.0-pjrt"))
    diff = diff_plans(plans["dev"], head)
    [replaced] = diff.replacements
    assert replaced.type == V2VM and replaced.replaced_by == ("runtimeVersion",)
    assert ("TPU node trainer will be REPLACED (deleted, then created) because runtimeVersion "
            "changed") in render_diff(diff, "markdown")


def test_label_change_updates_in_place(plans):
    head = plan_with_nodes("dev", lambda n: n[0].update(labels={"experiment": "lr-sweep"}))
    diff = diff_plans(plans["dev"], head)
    node_changes = [c for c in diff.changed if c.type == V2VM]
    assert [c.properties for c in node_changes] == [("labels.experiment",)]
    assert diff.replacements == []
    assert "WARNING" not in render_diff(diff, "table")


def test_new_node_adds_its_cost(plans):
    base = plan_with_nodes("dev", lambda nodes: nodes.clear())
    diff = diff_plans(base, plans["dev"])
    [node] = [r for r in diff.added if r["type"] == V2VM]
    [cost] = plans["dev"]["cost"]["nodes"]
    assert node["component"].endswith(cost["name"]) and cost["usdPerHour"] > 0
    assert diff.usd_per_hour_delta == pytest.approx(cost["usdPerHour"])
    assert f"change +${cost['usdPerHour']:,.2f}/hour" in render_diff(diff, "markdown")


def test_an_unchanged_stack_diffs_empty_through_a_file(plans, tmp_path):
    saved = tmp_path / "base.json"
    saved.write_text(json.dumps(plans["prod"]))
    again = plain(offline_plan("prod").to_json())
    assert diff_plans(json.loads(saved.read_text()), again).empty
