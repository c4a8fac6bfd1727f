"""Plan diff, report and policy pack on real offline plans of the repository's stacks."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from components.stack_config import file_config
from model.pulumi_types import (
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_KEY,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    TPU_V2_VM,
)
from ops.plan.diff import diff_plans, render_diff
from ops.plan.offline import offline_plan
from ops.plan.report import plain, render
from policy.evaluate import evaluate, load_config
from tests.repo_stacks import repo_stacks

V2VM = TPU_V2_VM
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
    return {stack: plain(offline_plan(stack).to_json()) for stack in repo_stacks()}


def test_every_stack_passes_the_pack(plans):
    assert set(plans) >= {"dev", "prod"}
    for stack, plan in plans.items():
        assert evaluate(plan, load_config()) == [], stack


def test_runtime_version_change_warns_of_replacement(plans):
    # The catalog documents one TF image (2.18.0); the diff reads plans, so the
    # head is the dev plan with a newer runtime written in.
    head = copy.deepcopy(plans["dev"])
    for resource in head["resources"]:
        if resource["type"] == V2VM:
            resource["inputs"]["runtimeVersion"] = "tpu-vm-tf-2.18.1-pjrt"
    diff = diff_plans(plans["dev"], head)
    [replaced] = diff.replacements
    assert replaced.type == V2VM and replaced.replaced_paths == ("runtimeVersion",)
    assert ('TPU node trainer will be REPLACED: node trainer: runtimeVersion: '
            '"tpu-vm-tf-2.18.0-pjrt" => "tpu-vm-tf-2.18.1-pjrt" (immutable: replace, delete '
            'first; its spot capacity may not come back') in render_diff(diff, "markdown")


def test_label_change_updates_in_place(plans):
    head = plan_with_nodes("dev", lambda n: n[0].update(labels={"experiment": "lr-sweep"}))
    diff = diff_plans(plans["dev"], head)
    node_changes = [c for c in diff.changed if c.type == V2VM]
    assert [c.paths for c in node_changes] == [("labels.experiment",)]
    assert diff.replacements == []
    assert "WARNING" not in render_diff(diff, "table")


def test_new_node_adds_its_cost(plans):
    base = plan_with_nodes("dev", lambda nodes: nodes.clear())
    diff = diff_plans(base, plans["dev"])
    [node] = [r for r in diff.added if r["type"] == V2VM]
    [cost] = plans["dev"]["cost"]["nodes"]
    assert node["component"].endswith(cost["name"]) and cost["usdPerHour"] > 0
    assert diff.usd_per_hour_delta == round(cost["usdPerHour"], 2)
    assert f"change +${cost['usdPerHour']:,.2f}/hour" in render_diff(diff, "markdown")


def test_an_unchanged_stack_diffs_empty_through_a_file(plans, tmp_path):
    saved = tmp_path / "base.json"
    saved.write_text(json.dumps(plans["prod"]))
    again = plain(offline_plan("prod").to_json())
    assert diff_plans(json.loads(saved.read_text()), again).empty


def _first(plan: dict[str, Any], type_: str, name: str | None = None) -> dict[str, Any]:
    return next(r for r in plan["resources"]
                if r["type"] == type_ and (name is None or r["name"] == name))


def _add_key(plan: dict[str, Any]) -> None:
    key = copy.deepcopy(_first(plan, SERVICEACCOUNT_ACCOUNT))
    key.update(type=SERVICEACCOUNT_KEY, name="ci-key", inputs={"serviceAccountId": "x"},
               urn=key["urn"].replace("serviceaccount/account:Account", "serviceaccount/key:Key"))
    plan["resources"].append(key)


BUCKET = STORAGE_BUCKET
PLAN_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "bucket-uniform-access": (
        lambda p: _first(p, BUCKET)["inputs"].update(uniformBucketLevelAccess=False),
        "set uniformBucketLevelAccess=true"),
    "no-public-members": (
        lambda p: _first(p, STORAGE_BUCKET_IAM_MEMBER)["inputs"].update(
            member="allUsers"),
        "grants access to allUsers"),
    "no-service-account-keys": (_add_key, "service-account key ci-key: keys are forbidden"),
    "tpu-not-default-service-account": (
        lambda p: _first(p, V2VM)["inputs"].pop("serviceAccount"),
        "serviceAccount.email is missing"),
    "no-privileged-project-roles": (
        lambda p: _first(p, PROJECTS_IAM_MEMBER)["inputs"].update(
            role="roles/editor"),
        "grants roles/editor on the whole project"),
    "protected-data-buckets": (
        lambda p: _first(p, BUCKET, "checkpoints").update(protect=False),
        "create it with protect=True"),
    "apis-kept-on-destroy": (
        lambda p: _first(p, PROJECTS_SERVICE)["inputs"].update(
            disableOnDestroy=True),
        "set disableOnDestroy=false"),
    "required-labels": (
        lambda p: _first(p, BUCKET)["inputs"]["labels"].pop("managed-by"),
        "is missing labels managed-by"),
}
CONFIG_EDITS: dict[str, tuple[Callable[[Nodes], None], str]] = {
    "tpu-spot-stacks": (lambda n: n[0].update(provisioning="spot"),
                        "spot/preemptible capacity in stack 'prod'"),
    "tpu-no-external-ip": (lambda n: n[0].update(externalIps=True),
                           "networkConfig.enableExternalIps is true in stack 'prod'"),
}
POLICY_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "tpu-max-chips": ({"maxChips": {"*": 8}}, "stack 'prod' asks for 16 TPU chips; the limit is 8"),
    "tpu-accelerator-allowlist": ({"allowedAcceleratorTypes": ["v5litepod-8"]},
                                  "accelerator type v4-32 is not allowed"),
}


def _assert_only(violations: list, policy: str, message: str) -> None:
    assert {v.policy for v in violations} == {policy}
    assert all(message in v.message for v in violations), [v.message for v in violations]


@pytest.mark.parametrize("policy", sorted(PLAN_EDITS))
def test_a_plan_edited_to_break_a_rule_fails_with_its_message(plans, policy):
    edit, message = PLAN_EDITS[policy]
    plan = copy.deepcopy(plans["prod"])
    edit(plan)
    _assert_only(evaluate(plan, load_config()), policy, message)


@pytest.mark.parametrize("policy", sorted(CONFIG_EDITS))
def test_a_stack_configured_to_break_a_rule_fails_with_its_message(policy):
    edit, message = CONFIG_EDITS[policy]
    _assert_only(evaluate(plan_with_nodes("prod", edit), load_config()), policy, message)


@pytest.mark.parametrize("policy", sorted(POLICY_CONFIGS))
def test_a_stricter_policy_config_fails_the_stack(plans, policy):
    settings, message = POLICY_CONFIGS[policy]
    _assert_only(evaluate(plans["prod"], {policy: settings}), policy, message)


@pytest.mark.parametrize("stack", ["platform", "dev"])
def test_the_plan_lists_the_warnings_the_program_logs(stack):
    """The program warns on its nodes at preview and up (stop save, cross-region reads:
    model/locality.py); the plan lists the same text. The platform's nlp pod in
    us-central2-b reads its data from the us-central1 data bucket."""
    plan = offline_plan(stack)
    warnings = plan.to_json()["warnings"]
    assert sorted(warnings) == sorted(m for level, m in plan.run.logs if level == "warning")
    far = [w for w in warnings if "outside its region" in w]
    if stack == "dev":
        assert far == []
        return
    assert far == [
        "node pod in us-central2-b reads trainData from gs://acme-ml-shared-platform-data "
        "(us-central1) and writes checkpoints to gs://acme-ml-shared-platform-nlp-checkpoints "
        "(us-central1), outside its region us-central2: GCS charges for data moved across "
        "regions, every epoch for training data, ~$20/TB moved (unconfirmed, model/catalog.py; "
        "cloud.google.com/storage/pricing, data transfer within Google Cloud); keep the "
        "buckets in the node's region, or the node in the buckets' region"]
    assert f"WARNING: {far[0]}" in render(plain(plan.to_json()), "table", [])


def _with_v4_pod(provisioning: str) -> Callable[[Nodes], None]:
    def add(nodes: Nodes) -> None:
        nodes.append({"name": "pod", "zone": "us-central2-b", "generation": "v4",
                      "topology": "2x2x4", "provisioning": provisioning,
                      "job": nodes[0]["job"]})
    return add


def test_an_unpriced_pod_makes_the_cost_unknown_and_unconfirmed_stays_marked(plans):
    """A v4 spot pod has no list price (model/catalog.py): the head's total and
    the change are unknown, not "$4.86 => $4.86"; made on-demand (priced, unconfirmed),
    the change from the unknown total stays unknown and the head keeps its mark."""
    spot = plan_with_nodes("dev", _with_v4_pod("spot"))
    assert spot["cost"]["unpriced"] == ["pod"]
    text = render_diff(diff_plans(plans["dev"], spot), "table")
    assert "TPU cost: $4.86/hour => unknown/hour (change unknown/hour, unknown/month" in text
    on_demand = plan_with_nodes("dev", _with_v4_pod("on-demand"))
    text = render_diff(diff_plans(spot, on_demand), "table")
    assert "TPU cost: unknown/hour => ~$56.38 (unconfirmed)/hour (change unknown/hour" in text
    report = render(spot, "table")
    assert "Estimated cost: unknown/hour, unknown/month" in report
