"""The preview of fallback candidates (model/candidates.py) and its place in the plan."""

from __future__ import annotations

import json

from components.stack_config import file_config
from model import catalog, cost
from model.candidates import candidate_rows, one_quota_warning
from model.settings.load import load_settings
from ops.plan.offline import offline_plan
from ops.plan.report import plain, render
from tests.infra.stack_fixtures import as_cli, config, node


def load(**changes: object):
    return load_settings(as_cli(config(tpu_stack_nodes=[node(**changes)])), "test")


def test_each_candidate_in_order_with_its_price_step_cost_and_unknown_headroom() -> None:
    settings = load(allowCostlier=True, fallback=[
        {"zone": "us-west4-a"}, {"zone": "europe-west4-b", "provisioning": "on-demand"}])
    trainer, job = settings.node_jobs[0]

    rows = candidate_rows(trainer, job)

    assert [(r.position, r.zone, r.provisioning) for r in rows] == [
        (1, "us-central1-a", "spot"), (2, "us-west4-a", "spot"),
        (3, "europe-west4-b", "on-demand")]
    v5e8 = catalog.parse_accelerator_type("v5litepod-8")
    assert rows[2].usd_per_hour == catalog.usd_per_hour(v5e8, spot=False)
    assert rows[0].usd_per_1000_steps == cost.node_cost(trainer, job=job).step.usd_per_1000_steps
    assert rows[1].quota == catalog.TPU_QUOTA_IDS[("v5e", "preemptible")]
    assert rows[2].quota == catalog.TPU_QUOTA_IDS[("v5e", "onDemand")]
    assert {r.quota_headroom for r in rows} == {"unknown"}
    assert {r.reservation_headroom for r in rows} == {"n/a"}
    assert rows[1].to_json()["quotaHeadroom"] == "unknown"


def test_headroom_read_from_cloud_quotas_is_shown_per_quota_and_region() -> None:
    settings = load(fallback=[{"zone": "us-west4-a"}])
    trainer, job = settings.node_jobs[0]
    quota = catalog.TPU_QUOTA_IDS[("v5e", "preemptible")]

    rows = candidate_rows(trainer, job, headroom={(quota, "us-west4"): 24})

    assert [r.quota_headroom for r in rows] == ["unknown", "24"]


def test_a_warning_when_every_candidate_draws_on_one_regional_quota() -> None:
    same_region = load(allowCostlier=True,
                       fallback=[{"zone": "us-central1-a", "acceleratorType": "v5litepod-16"}])
    spread = load(fallback=[{"zone": "us-west4-a"}])

    warning = one_quota_warning(same_region.nodes[0])

    assert warning is not None and "us-central1" in warning
    assert catalog.TPU_QUOTA_IDS[("v5e", "preemptible")] in warning
    assert one_quota_warning(spread.nodes[0]) is None
    assert one_quota_warning(load().nodes[0]) is None


def test_the_plan_lists_the_candidates_and_warns() -> None:
    config_ = file_config("dev")
    nodes = json.loads(config_["tpu-stack:nodes"])
    nodes[0].update(fallback=[{"zone": nodes[0]["zone"], "acceleratorType": "v5litepod-16"}],
                    allowCostlier=True)
    config_["tpu-stack:nodes"] = json.dumps(nodes)

    plan = plain(offline_plan("dev", config_).to_json())
    text = render(plan, "table")

    assert [r["position"] for r in plan["candidates"][nodes[0]["name"]]] == [1, 2]
    assert any("every fallback candidate draws on one regional quota" in w
               for w in plan["warnings"])
    assert "fallback candidates, tried in order" in text
    assert "v5litepod-16" in text and "unknown" in text


def test_declared_quota_less_the_plans_other_nodes_is_an_upper_bound_on_headroom() -> None:
    from model.candidates import declared_headroom, stack_candidates

    settings = load_settings(as_cli(config(
        # A candidate counts against the quota of its region too (settings: declared).
        tpu_stack_quota={"v5e": {"us-central1": {"onDemand": 16, "preemptible": 128},
                                 "us-west4": {"preemptible": 16}}},
        tpu_stack_nodes=[node(fallback=[{"zone": "us-west4-a"}]),
                         node(name="other")])), "test")
    trainer = settings.nodes[0]
    quota = catalog.TPU_QUOTA_IDS[("v5e", "preemptible")]

    assert declared_headroom(settings, trainer)[(quota, "us-central1")] == "<=120"
    rows = stack_candidates(settings)["trainer"]
    assert [r["quotaHeadroom"] for r in rows] == ["<=120", "<=16"]
