"""`ops.plan.diff`: the engine's steps, cost delta, replacement chains and warnings."""

from __future__ import annotations

import copy
import json

import pytest

from model.pulumi_types import (
    DYNAMIC_QUEUED_TPU,
    PROJECTS_IAM_MEMBER,
    SERVICEACCOUNT_ACCOUNT,
    STORAGE_BUCKET,
)
from ops.plan.diff import diff_plans, load_plan, render_diff, replacement_warnings
from policy.evaluate import Violation


def test_runtime_version_change_warns_of_replacement(make_plan, node):
    base = make_plan({"trainer": node()})
    changed = node()
    changed["runtimeVersion"] = "tpu-vm-tf-2.18.0-pod-pjrt"
    diff = diff_plans(base, make_plan({"trainer": changed}))
    assert [c.replaced_paths for c in diff.replacements] == [("runtimeVersion",)]
    text = render_diff(diff, "markdown")
    assert "> [!WARNING]" in text
    assert ('TPU node trainer will be REPLACED: node trainer: runtimeVersion: '
            '"tpu-vm-tf-2.18.0-pjrt" => "tpu-vm-tf-2.18.0-pod-pjrt" (immutable: replace, '
            'delete first; on-demand capacity in us-central1-a is not guaranteed without a '
            'reservation)' in text)
    assert "+-gcp:tpu:V2Vm: trainer [dev-trainer in us-central1-a] (replace, delete " \
        "first)" in text
    # pulumi/pulumi display/diff.go renderSummaryEvent: one kind, no "N changes"; the
    # bucket, the stack and the gcp default provider unchanged.
    assert "Resources:\n    +-1 to replace\n    3 unchanged\n" in text


@pytest.mark.parametrize(("base_node", "words"), [
    ({"schedulingConfig": {"spot": True}}, "replace, delete first; its spot capacity may not "
     "come back: spot TPUs run only on spare capacity"),
    ({"schedulingConfig": {"reserved": True}}, "replace, delete first; its reserved capacity "
     "comes back only if the freed reservation"),
    ({"schedulingConfig": {"preemptible": True}}, "its preemptible capacity may not come back"),
])
def test_each_replaced_node_says_what_its_capacity_risks(make_plan, node, base_node, words):
    base = node()
    base.update(base_node)
    head = {**base, "acceleratorType": "v5litepod-16"}
    text = render_diff(diff_plans(make_plan({"trainer": base}), make_plan({"trainer": head})),
                       "table")
    assert words in text


QUEUED = DYNAMIC_QUEUED_TPU


def test_a_replaced_queued_node_may_lose_its_place_in_the_queue(make_plan):
    queued = {"node_id": "dev-q", "zone": "us-central1-a", "accelerator_type": "v5litepod-8",
              "runtime_version": "tpu-vm-tf-2.18.0-pjrt", "spot": True}
    base = make_plan({})
    base["resources"].append({**base["resources"][0], "type": QUEUED,
                              "urn": "urn:pulumi:dev::tpu-stack::dyn::q", "name": "q",
                              "inputs": queued, "deleteBeforeReplace": None})
    head = json.loads(json.dumps(base))
    head["resources"][-1]["inputs"]["accelerator_type"] = "v5litepod-16"
    data = json.loads(render_diff(diff_plans(base, head), "json"))
    [warning] = data["warnings"]
    assert warning.endswith("(immutable: replace, delete first; its queued capacity may not "
                            "come back: the new request joins the queue again and may wait "
                            "hours or days)")
    [step] = data["steps"]
    assert (step["op"], step["deleteFirst"], step["gcpName"]) == (
        "replace", True, "dev-q in us-central1-a")
    assert step["deleteFirstBecause"] == "the provider deletes it first"
    head["resources"].pop()
    [removed] = json.loads(render_diff(diff_plans(base, head), "json"))["warnings"]
    assert removed.startswith("TPU node q will be DELETED; its queued capacity may not come")


def test_label_metadata_change_updates_in_place(make_plan, node):
    changed = node()
    changed["labels"]["team"] = "vision"
    changed["metadata"]["startup-script"] = "#!/bin/bash\necho new\n"
    diff = diff_plans(make_plan({"trainer": node()}), make_plan({"trainer": changed}))
    assert [c.paths for c in diff.changed] == [("labels.team", "metadata.startup-script")]
    assert diff.replacements == []
    assert "WARNING" not in render_diff(diff, "table")
    assert "update" in render_diff(diff, "table")


def test_nested_replacing_property_is_named(make_plan, node):
    spot = node(spot=True)
    diff = diff_plans(make_plan({"trainer": node()}), make_plan({"trainer": spot}))
    assert diff.replacements[0].replaced_paths == ("schedulingConfig.spot",)


def test_new_node_adds_its_cost(make_plan, node):
    base = make_plan({"trainer": node()}, usd_per_hour={"trainer": 9.6})
    head = make_plan({"trainer": node(), "eval": node("v5litepod-4")},
                     usd_per_hour={"trainer": 9.6, "eval": 4.8})
    diff = diff_plans(base, head)
    assert [r["name"] for r in diff.added] == ["eval"]
    assert diff.usd_per_hour_delta == pytest.approx(4.8)
    assert "change +$4.80/hour, +$3,504.00/month" in render_diff(diff, "markdown")


def test_removed_node_warns(make_plan, node):
    diff = diff_plans(make_plan({"a": node(), "b": node()}), make_plan({"a": node()}))
    assert [r["name"] for r in diff.removed] == ["b"]
    assert ("TPU node b will be DELETED; on-demand capacity in us-central1-a is not guaranteed"
            in render_diff(diff, "markdown"))
    assert diff.usd_per_hour_delta == pytest.approx(-9.6)


def test_identical_plans_and_protect_option(make_plan):
    plan = make_plan()
    assert diff_plans(plan, plan).empty
    assert "Resources:\n    4 unchanged\n" in render_diff(diff_plans(plan, plan), "table")
    protected = make_plan()
    protected["resources"][0]["protect"] = True
    # The engine's diff ignores the option: a same step, counted unchanged, that shows
    # the lock (step_generator.go continueStepsFromDiff; rule `sameStepWithoutDiff`).
    diff = diff_plans(plan, protected)
    assert diff.changed == [] and [s.op for s in diff.steps.steps] == ["same"]
    assert diff.steps.steps[0].paths == ("(protect)",)
    text = render_diff(diff, "table")
    assert "  gcp:storage:Bucket: checkpoints [gs://] (same)\n" \
        "    ~ (protect): false => true (option)" in text
    assert "Resources:\n    4 unchanged\n" in text


def test_json_format_and_violations(make_plan, node):
    changed = node("v5litepod-16")
    diff = diff_plans(make_plan(), make_plan({"trainer": changed}, usd_per_hour={"trainer": 19.2}))
    violation = Violation("tpu-max-chips", "too many chips", None)
    data = json.loads(render_diff(diff, "json", [violation]))
    [step] = data["steps"]
    assert [(c["path"], c["old"], c["new"], c["replaces"]) for c in step["changes"]] == [
        ("acceleratorType", "v5litepod-8", "v5litepod-16", True)]
    assert data["summary"] == {"create": 0, "update": 0, "replace": 1, "delete": 0,
                               "unchanged": 3}
    assert data["cost"]["deltaUsdPerHour"] == pytest.approx(9.6)
    assert data["violations"] == [{"policy": "tpu-max-chips", "message": "too many chips",
                                   "urn": None}]
    assert "**tpu-max-chips** (stack): too many chips" in render_diff(diff, "markdown",
                                                                      [violation])


def test_an_unpriced_node_makes_every_total_and_change_unknown(make_plan, node):
    """A node without a list price: the head's total and the change are unknown, not the
    priced nodes' sum (which read as no change), whatever the other node does."""
    priced = make_plan({"trainer": node()})
    both = make_plan({"trainer": node(), "pod": node("v4-32")},
                     usd_per_hour={"pod": None})
    diff = diff_plans(priced, both)
    assert (diff.head_usd_per_hour, diff.usd_per_hour_delta) == (None, None)
    assert "TPU cost: $9.60/hour => unknown/hour (change unknown/hour, unknown/month" \
        in render_diff(diff, "table")
    assert json.loads(render_diff(diff, "json"))["cost"]["deltaUsdPerHour"] is None


def test_an_unconfirmed_price_stays_marked_and_totals_add_the_shown_figures(make_plan, node):
    base = make_plan({"a": node()}, usd_per_hour={"a": 1.004})
    head = make_plan({"a": node(), "b": node()}, usd_per_hour={"a": 1.004, "b": 1.004})
    head["cost"]["unconfirmed"] = ["b"]
    diff = diff_plans(base, head)
    # $1.00 + $1.00 shown: $2.00, not $2.01 (2.008 rounded).
    assert "$1.00/hour => ~$2.00 (unconfirmed)/hour (change ~+$1.00 (unconfirmed)/hour" \
        in render_diff(diff, "table")


def test_bad_format_and_bad_base_file(make_plan, tmp_path):
    with pytest.raises(ValueError, match="--format 'html' is not a format; allowed: markdown"):
        render_diff(diff_plans(make_plan(), make_plan()), "html")
    (tmp_path / "base.json").write_text('{"stack": "dev"}')
    with pytest.raises(ValueError, match="not a plan"):
        load_plan(tmp_path / "base.json")
    with pytest.raises(ValueError, match="cannot read a plan"):
        load_plan(tmp_path / "missing.json")


def test_queued_node_follows_its_provider(make_plan):
    queued = {"node_id": "dev-q", "runtime_version": "tpu-vm-tf-2.18.0-pjrt",
              "accelerator_type": "v5litepod-8", "labels": {"stack": "dev"}, "poll_seconds": 15,
              "__provider": "pickled-1"}
    base = make_plan({})
    base["resources"].append({**base["resources"][0], "type": QUEUED,
                              "urn": "urn:pulumi:dev::tpu-stack::dyn::q", "name": "q",
                              "inputs": queued})
    head = json.loads(json.dumps(base))
    head["resources"][-1]["inputs"].update(labels={"stack": "dev", "team": "a"}, poll_seconds=5,
                                           __provider="pickled-2")
    assert diff_plans(base, head).replacements == []
    head["resources"][-1]["inputs"]["accelerator_type"] = "v5litepod-16"
    assert diff_plans(base, head).replacements[0].replaced_paths == ("accelerator_type",)


def _res(type_: str, name: str, inputs: dict, **extra: object) -> dict:
    return {"urn": f"urn:pulumi:dev::tpu-stack::{type_}::{name}", "type": type_, "name": name,
            "custom": True, "inputs": inputs, "deleteBeforeReplace": None, **extra}


def test_steps_follow_the_engine_create_before_delete_and_unknown_outputs():
    account = SERVICEACCOUNT_ACCOUNT
    member = PROJECTS_IAM_MEMBER
    bucket = STORAGE_BUCKET
    sa = _res(account, "runtime", {"accountId": "dev-runtime", "project": "p"})
    grant = _res(member, "grant", {"member": "serviceAccount:dev-runtime@p", "role": "r",
                                   "project": "p"},
                 propertyDependencies={"member": [sa["urn"]]})
    labels_from = _res(bucket, "b", {"location": "US", "labels": {"sa": "dev-runtime@p"}},
                       propertyDependencies={"labels": [sa["urn"]]})
    base = {"stack": "dev", "resources": [sa, grant, labels_from]}
    moved = json.loads(json.dumps(base))
    moved["resources"][0]["inputs"]["project"] = "q"  # ForceNew: the account is replaced
    diff = diff_plans(base, moved)
    steps = {s.name: s for s in diff.steps.steps}
    # Explicit accountId: delete first; its member takes the unknown email (ForceNew):
    # replaced too (step_generator.go calculateDependentReplacements); the bucket's labels
    # take it in place.
    assert (steps["runtime"].op, steps["runtime"].delete_first) == ("replace", True)
    assert (steps["grant"].op, steps["grant"].replaced_paths) == ("replace", ("member",))
    assert steps["grant"].delete_first  # pulumi-gcp sets DeleteBeforeReplace on IAMMember
    assert (steps["b"].op, steps["b"].paths) == ("update", ("labels.sa",))
    # Without an explicit accountId the account is auto-named: create, then delete.
    for plan in (base, moved):
        del plan["resources"][0]["inputs"]["accountId"]
    replaced = diff_plans(base, moved).steps.by_urn()[sa["urn"]]
    assert (replaced.op, replaced.delete_first) == ("replace", False)
    assert "+-gcp:serviceaccount:Account: runtime (replace)" in render_diff(
        diff_plans(base, moved), "table")


def test_secrets_are_masked_and_long_values_shortened(make_plan, node):
    base, head = make_plan({"trainer": node()}), make_plan({"trainer": node()})
    head["resources"][1]["inputs"]["metadata"]["startup-script"] = "#!/bin/bash\n" + "x" * 200
    for plan, token in ((base, "old-token"), (head, "new-token")):
        plan["resources"][1]["inputs"]["description"] = token
        plan["resources"][1]["secrets"] = ["description"]
    text = render_diff(diff_plans(base, head), "table")
    data = json.loads(render_diff(diff_plans(base, head), "json"))
    assert "token" not in text and "token" not in json.dumps(data)
    assert "~ description: [secret] => [secret] (update in place)" in text
    assert "chars, sha256 " in text and "x" * 100 not in text
    assert "Resources:\n    ~ 1 to update\n    3 unchanged" in text


def test_an_update_of_a_waiting_queued_node_says_it_is_held(make_plan):
    queued = {"node_id": "dev-q", "zone": "us-central1-a", "metadata": {"k": "1"},
              "accelerator_type": "v5litepod-8"}
    base = make_plan({})
    base["resources"].append({**base["resources"][0], "type": QUEUED, "name": "q",
                              "urn": "urn:pulumi:dev::tpu-stack::dyn::q", "inputs": queued})
    head = json.loads(json.dumps(base))
    head["resources"][-1]["inputs"]["metadata"]["k"] = "2"
    [warning] = replacement_warnings(diff_plans(base, head))
    assert warning.startswith("TPU node q is queued: if its request is still waiting, this "
                              "update (metadata.k) is held and applied once the node exists; "
                              "the request keeps its place in the queue")


def test_protect_refuses_replace_and_delete_and_unprotecting_at_once_warns(make_plan, node):
    """step_generator.go: a replace of a resource protected before and after is an error;
    step.go DeleteStep.Apply: so is a protected delete; unprotected in the same change,
    the replace goes ahead (a warning says what is lost)."""
    base = make_plan({"trainer": node()})
    base["resources"][0]["protect"] = True  # the bucket
    moved = copy.deepcopy(base)
    moved["resources"][0]["inputs"]["location"] = "EU"
    moved["resources"][0]["inputs"]["name"] = "b"
    base["resources"][0]["inputs"]["name"] = "b"
    base["resources"][0]["inputs"]["location"] = "US"
    diff = diff_plans(base, moved)
    [bucket] = diff.refused
    assert bucket.op == "replace" and "marked for protection" in bucket.refused
    text = render_diff(diff, "markdown")
    assert "> [!CAUTION]" in text and "error: unable to replace resource" in text
    assert json.loads(render_diff(diff, "json"))["refused"] == [bucket.urn]
    unprotected = copy.deepcopy(moved)
    unprotected["resources"][0]["protect"] = False
    diff = diff_plans(base, unprotected)
    assert diff.refused == [] and [s.op for s in diff.replacements] == ["replace"]
    assert any("unprotects and replaces it at once" in w for w in replacement_warnings(diff))
    gone = copy.deepcopy(base)
    del gone["resources"][0]
    [delete] = diff_plans(base, gone).refused
    assert delete.op == "delete" and "cannot be deleted\nbecause it is protected" in \
        delete.refused and "pulumi state unprotect" in delete.refused


def test_a_retained_delete_says_the_resource_stays(make_plan):
    """step.go DeleteStep.Apply: a retainOnDelete resource's delete only leaves the state."""
    base = make_plan()
    base["resources"][0]["retainOnDelete"] = True
    gone = copy.deepcopy(base)
    del gone["resources"][0]
    diff = diff_plans(base, gone)
    [delete] = diff.removed and diff.steps.of("delete")
    assert delete.stays_in_gcp.startswith("retainOnDelete") and not delete.refused
    assert "checkpoints will stay in GCP: retainOnDelete" in " ".join(
        replacement_warnings(diff))
    assert "      stays in GCP: retainOnDelete" in render_diff(diff, "table")
