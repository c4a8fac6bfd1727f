"""`ops.plan.report`: markdown / table / json with cost per hour and month, policy results."""

from __future__ import annotations

import json

import pytest

from model.pulumi_types import STORAGE_BUCKET, TPU_V2_VM
from ops.plan.report import fitted_widths, render, table
from policy.evaluate import evaluate


def test_markdown_shows_nodes_cost_and_policy(make_plan, node):
    plan = make_plan({"trainer": node(spot=True)}, usd_per_hour={"trainer": 4.856})
    text = render(plan, "markdown", evaluate(plan))
    assert text.startswith("## tpu-stack plan: dev (acme-ml-dev)")
    assert ("Estimated cost: $4.86/hour, $3,544.88/month (730 h) at list prices; TPU nodes "
            "only (buckets, network and logging are not priced)") in text
    assert ("| trainer | dev-trainer in us-central1-a | v5litepod-8 | tpu-vm-tf-2.18.0-pjrt | spot "
            "| $4.86 | $3,544.88 | $4.74 |") in text
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
    (tpu,) = run.of_type(TPU_V2_VM) + run.of_type(QUEUED_TYPE)
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
    assert _node_row(**changes)[4] == provisioning


def test_a_node_sent_as_a_shape_shows_its_accelerator_type():
    row = _node_row(provisioning="reserved", acceleratorType=None, generation="v4",
                    topology="2x2x4", zone="us-central2-b")
    assert row[2] == "v4-32 (2x2x4)"


def _platform_plan(**pod: object) -> dict:
    """The platform stack's offline plan, nlp's `pod` node (v4-32, queued on the
    platform's reservation) edited; a key set to None is removed."""
    from components.stack_config import file_config
    from ops.plan.offline import offline_plan
    from ops.plan.report import plain

    config = file_config("platform")
    teams = json.loads(config["tpu-stack:teams"])
    nodes = teams["nlp"]["nodes"]
    index = next(i for i, node in enumerate(nodes) if node["name"] == "pod")
    nodes[index] = {k: v for k, v in {**nodes[index], **pod}.items() if v is not None}
    teams["nlp"]["quota"]["v4"]["onDemand"] = 16  # room for the node made on-demand
    config["tpu-stack:teams"] = json.dumps(teams)
    return plain(offline_plan("platform", config).to_json())


def test_costs_say_what_they_cover_and_where_each_price_comes_from():
    from ops.plan.report import cost_summary, node_rows

    plan = _platform_plan()
    rows = {row[0]: row for row in node_rows(plan)}
    # A reserved node is billed through its reservation, at an unconfirmed v4 price.
    assert rows["nlp-pod"][1] == "platform-nlp-pod in us-central2-b"
    assert rows["nlp-pod"][5:] == ["~$51.52 (unconfirmed) via reservation",
                                   "~$37,609.60 (unconfirmed) via reservation", ""]
    assert rows["nlp-sweep"][5:] == ["$4.86", "$3,544.88", "$4.74"]
    summary = cost_summary(plan)
    assert "TPU nodes only (buckets, network and logging are not priced)" in summary
    assert ("- billed through their reservation, at the on-demand rate whether or not the node "
            "runs (reservations-overview; unconfirmed for TPUs): nlp-pod") in summary
    assert ("- prices per chip-hour from v4: docs/tpu-facts.md: unconfirmed secondary source; "
            "v5e: docs/tpu-facts.md: third-party catalog extract, 2026-08") in summary
    assert plan["cost"]["usdPerHour"] == pytest.approx(51.52 + 4.856)


def test_an_unconfirmed_price_is_marked_and_on_demand_has_no_spot_saving():
    from ops.plan.report import cost_summary, node_rows

    plan = _platform_plan(provisioning="on-demand", queue=None)
    rows = {row[0]: row for row in node_rows(plan)}
    assert rows["nlp-pod"][5:] == ["~$51.52 (unconfirmed)", "~$37,609.60 (unconfirmed)", ""]
    summary = cost_summary(plan)
    assert summary.startswith("Estimated cost: ~$56.38/hour, ~$41,154.48/month")
    assert "- priced from an unconfirmed list price (~): nlp-pod" in summary
    [pod] = [n for n in plan["cost"]["nodes"] if n["name"] == "nlp-pod"]
    assert (pod["priceConfirmed"], pod["spotSavingUsdPerHour"]) == (False, None)


def test_the_plan_shows_the_gcp_names_it_will_create():
    from ops.plan.offline import offline_plan
    from ops.plan.report import plain

    text = render(plain(offline_plan("dev").to_json()), "markdown")
    for name in ("gs://acme-ml-dev-dev-checkpoints", "dev-trainer in us-central1-a",
                 "dev-runtime@acme-ml-dev.iam.gserviceaccount.com", "dev-tpu-us-central1"):
        assert name in text


def test_the_terminal_tables_fit_100_columns_and_never_cut_a_name():
    """The platform plan's tables (the widest: long team names, accounts, types) fit a
    100-column terminal; a value too long for its column is whole on a line of its own
    (one longer than 100 columns too), so every GCP name can be copied."""
    from ops.plan.offline import offline_plan
    from ops.plan.report import gcp_name, plain

    plan = plain(offline_plan("platform").to_json())
    text = render(plan, "table")
    tables = text[text.index("\nnode "):]
    lines = tables.splitlines()
    assert all(len(line) <= 100 or "  " not in line.strip() for line in lines)
    assert "…" not in tables
    values = {value for line in lines for value in line.split()}
    names = {gcp_name(r) for r in plan["resources"] if r.get("custom", True)} - {""}
    assert {name for name in names if " " not in name} <= values
    assert "gcp:storage:Bucket" in tables and STORAGE_BUCKET not in tables
    assert "[CiIdentity:ci-vision]" in tables


def test_a_long_value_goes_whole_onto_its_own_line_under_its_column():
    rows = [["checkpoints", "gs://acme-ml-dev-dev-checkpoints", "gcp:storage:Bucket"],
            ["data", "gs://acme-ml-dev-dev-data", "gcp:storage:Bucket"]]
    text = table(("resource", "GCP name", "type"), rows, markdown=False, columns=60)
    assert text.splitlines() == [
        "resource     GCP name                     type",
        "checkpoints  ↓                            gcp:storage:Bucket",
        "             gs://acme-ml-dev-dev-checkpoints",
        "data         gs://acme-ml-dev-dev-data    gcp:storage:Bucket"]


def test_fitted_widths_shrink_the_widest_column_first():
    assert fitted_widths([60, 60, 9], 100) == [43, 44, 9]
