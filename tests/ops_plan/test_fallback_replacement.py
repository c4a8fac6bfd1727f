"""A FallbackTpu's candidates edited in a PR: removing a candidate (the node may run on it)
is a replacement in the preview, as FallbackTpuProvider.diff replaces; adding or
reordering is an update."""

from __future__ import annotations

import json

import pytest

from components.fallback_tpu import FallbackTpuProvider
from model.pulumi_types import DYNAMIC_FALLBACK_TPU
from ops.plan.diff import diff_plans, render_diff

FALLBACK = DYNAMIC_FALLBACK_TPU
OWN = {"zone": "us-central1-a", "accelerator_type": "v5litepod-8", "spot": True,
       "provisioning": "spot"}
WEST = {**OWN, "zone": "us-west4-a"}
EUROPE = {**OWN, "zone": "europe-west4-b"}


def with_node(make_plan, candidates: list[dict]) -> dict:
    plan = make_plan({})
    inputs = {"node_id": "dev-trainer", "runtime_version": "tpu-vm-tf-2.18.0-pjrt",
              **OWN, "candidates": candidates}
    plan["resources"].append({**plan["resources"][0], "type": FALLBACK, "name": "trainer",
                              "urn": "urn:pulumi:dev::tpu-stack::dyn::trainer",
                              "inputs": inputs, "deleteBeforeReplace": None})
    return plan


def step_of(base: dict, head: dict) -> dict:
    [step] = json.loads(render_diff(diff_plans(base, head), "json"))["steps"]
    return step


def test_removing_a_candidate_is_a_replacement_named_by_its_label(make_plan):
    base = with_node(make_plan, [OWN, WEST, EUROPE])

    step = step_of(base, with_node(make_plan, [OWN, WEST]))

    assert (step["op"], step["deleteFirst"]) == ("replace", True)
    text = render_diff(diff_plans(base, with_node(make_plan, [OWN, WEST])), "table")
    assert "replaced if it runs on the removed candidate 3/3 europe-west4-b spot" in text


@pytest.mark.parametrize("head", [[OWN, WEST, EUROPE, {**OWN, "zone": "us-south1-a"}],
                                  [OWN, EUROPE, WEST]])
def test_adding_or_reordering_candidates_is_an_update(make_plan, head):
    step = step_of(with_node(make_plan, [OWN, WEST, EUROPE]), with_node(make_plan, head))

    assert step["op"] == "update"


@pytest.mark.parametrize(("runs_on", "replaced"), [(EUROPE, True), (WEST, False)])
def test_the_provider_replaces_only_when_its_own_candidate_goes(runs_on, replaced):
    olds = {"candidates": [OWN, WEST, EUROPE], "placement": runs_on}
    news = {"candidates": [OWN, WEST]}

    diff = FallbackTpuProvider().diff("id", olds, news)

    assert ("candidates" in (diff.replaces or [])) is replaced
