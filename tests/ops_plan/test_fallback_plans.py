"""Offline plans: nodes without fallback keep their resources; a node with it is a FallbackTpu."""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.stack_config import file_config
from model.pulumi_types import COMPUTE_SUBNETWORK, DYNAMIC_FALLBACK_TPU, TPU_V2_VM
from ops.plan.offline import offline_plan
from ops.plan.report import plain
from policy.evaluate import evaluate, load_config
from tests.repo_stacks import SHIPPED_STACKS

FALLBACK = DYNAMIC_FALLBACK_TPU


def plan_json(stack: str, config: dict[str, str]) -> str:
    return json.dumps(plain(offline_plan(stack, config).to_json()), sort_keys=True)


def with_explicit_defaults(config: dict[str, str]) -> dict[str, str]:
    """Every node (a team's too) with `fallback: []` and `allowCostlier: false` written out."""
    edited = dict(config)
    nodes = json.loads(edited.get("tpu-stack:nodes") or "[]")
    for node in nodes:
        node.update(fallback=[], allowCostlier=False)
    edited["tpu-stack:nodes"] = json.dumps(nodes)
    if "tpu-stack:teams" in edited:
        teams = json.loads(edited["tpu-stack:teams"])
        for team in teams.values():
            for node in team.get("nodes") or []:
                node.update(fallback=[], allowCostlier=False)
        edited["tpu-stack:teams"] = json.dumps(teams)
    return edited


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_a_shipped_stack_without_fallback_plans_the_same_bytes(stack: str) -> None:
    config = file_config(stack)
    plain_plan = plan_json(stack, config)

    assert plan_json(stack, with_explicit_defaults(config)) == plain_plan
    assert FALLBACK not in plain_plan


def resources(plan: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"] == type_]


def test_a_node_with_fallback_is_one_fallback_tpu_with_a_subnet_per_candidate_region() -> None:
    config = file_config("dev")
    nodes = json.loads(config["tpu-stack:nodes"])
    own = nodes[0]
    nodes[0] = {**own, "maxWait": "20m", "allowCostlier": True,
                "fallback": [{"zone": "europe-west4-b"}, {"zone": "us-west4-a"}]}
    config["tpu-stack:nodes"] = json.dumps(nodes)

    plan = plain(offline_plan("dev", config).to_json())

    (node,) = resources(plan, FALLBACK)
    zones = [c["zone"] for c in node["inputs"]["candidates"]]
    assert zones == [own["zone"], "europe-west4-b", "us-west4-a"]
    assert node["inputs"]["max_wait_seconds"] == 1200
    assert resources(plan, TPU_V2_VM) == []
    regions = {r["inputs"]["region"] for r in resources(plan, COMPUTE_SUBNETWORK)}
    assert regions == {"us-central1", "europe-west4", "us-west4"}
    assert evaluate(plan, load_config()) == []  # the pack reads it as a TPU node
    # tpuctl recover queues a candidate on the subnet the program made for its region.
    from model.fleet import target_for
    from model.settings.load import load_settings

    (expected,) = target_for(load_settings(config, "dev")).nodes
    for sent, known in zip(node["inputs"]["candidates"], expected.candidates, strict=True):
        assert sent["subnetwork"].endswith(f"/subnetworks/{known['subnet_name']}")
        assert {k: v for k, v in sent.items() if k != "subnetwork"} == {
            k: v for k, v in known.items()
            if k not in ("subnetwork", "subnet_name") and v is not None}
