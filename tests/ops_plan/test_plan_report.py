"""`ops.plan.report`: markdown / table / json with cost per hour and month, policy results."""

from __future__ import annotations

import json

import pytest

from ops.plan.report import render
from policy.evaluate import evaluate


def test_markdown_shows_nodes_cost_and_policy(make_plan, node):
    plan = make_plan({"trainer": node(spot=True)}, usd_per_hour={"trainer": 4.856})
    text = render(plan, "markdown", evaluate(plan))
    assert text.startswith("## tpu-stack plan: dev (acme-ml-dev)")
    assert "Estimated cost: $4.86/hour, $3,544.88/month (730 h)" in text
    assert "| trainer | v5litepod-8 | tpu-vm-tf-2.18.0-pjrt | spot | $4.86 | $3,544.88 | $4.74 |" \
        in text
    assert "Policy pack: every guardrail passes." in text


def test_violations_are_listed(make_plan, node):
    bad = node()
    del bad["serviceAccount"]
    plan = make_plan({"trainer": bad}, stack="prod")
    violations = evaluate(plan)
    policies = {v.policy for v in violations}
    assert "tpu-not-default-service-account" in policies
    assert "required-labels" not in policies or all(v.urn for v in violations)
    text = render(plan, "table", violations)
    assert f"Policy pack: {len(violations)} violation(s)" in text
    assert "tpu-not-default-service-account (trainer): TPU node trainer" in text


def test_json_adds_monthly_cost_and_violations(make_plan):
    plan = make_plan(usd_per_hour={"trainer": 2.0})
    data = json.loads(render(plan, "json", evaluate(plan)))
    assert data["cost"]["usdPerMonth"] == pytest.approx(1460.0)
    assert data["violations"] == []
    assert data["resources"] == plan["resources"]


def test_evaluate_honours_policy_config(make_plan, node):
    plan = make_plan({"trainer": node(spot=True)}, stack="prod")
    assert {v.policy for v in evaluate(plan)} >= {"tpu-spot-stacks"}
    relaxed = {"tpu-spot-stacks": {"spotStacks": ["prod"]},
               "protected-data-buckets": {"enforcementLevel": "disabled"},
               "required-labels": {"requiredLabels": ["managed-by"]}}
    assert evaluate(plan, relaxed) == []


def test_duplicate_urns_are_a_loud_error(make_plan, node):
    plan = make_plan({"trainer": node()})
    plan["resources"].append(dict(plan["resources"][-1]))
    urn = plan["resources"][-1]["urn"]
    assert "> [!CAUTION]\n> ERROR: resources share a URN" in render(plan, "markdown")
    assert f"- {urn}" in render(plan, "table")
    assert json.loads(render(plan, "json"))["duplicateUrns"] == [urn]
    assert "duplicateUrns" in render(make_plan(), "json")


def _node_row(**node_changes: object) -> list[str]:
    """The plan's node row for one node as components/tpu_node.py declares it."""
    from ops.plan.report import node_rows
    from tests.infra.test_components import node_run
    from tests.ops.test_tpu_queued_component import QUEUED_TYPE

    run, _ = node_run(**node_changes)
    (tpu,) = run.of_type("gcp:tpu/v2Vm:V2Vm") + run.of_type(QUEUED_TYPE)
    resource = {"type": tpu.type, "name": tpu.name, "inputs": tpu.inputs,
                "component": "TpuNode:node-trainer"}
    (row,) = node_rows({"resources": [resource]})
    return row


@pytest.mark.parametrize(("changes", "provisioning"), [
    ({}, "spot"),
    ({"provisioning": "on-demand"}, "on-demand"),
    ({"provisioning": "reserved"}, "reserved"),
    ({"provisioning": "preemptible"}, "preemptible"),
    ({"provisioning": "queued", "queue": {"spot": True}}, "queued, spot"),
    ({"provisioning": "queued", "queue": {"guaranteed": True}}, "queued, guaranteed"),
])
def test_the_provisioning_column_says_what_the_node_is_sent_as(changes, provisioning):
    assert _node_row(**changes)[3] == provisioning


def test_a_node_sent_as_a_shape_shows_its_accelerator_type():
    row = _node_row(provisioning="reserved", acceleratorType=None, generation="v4",
                    topology="2x2x4", zone="us-central2-b")
    assert row[1] == "v4-32 (2x2x4)"
