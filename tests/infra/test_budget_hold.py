"""Nodes a budget stop deleted stay deleted (issue 36): the program reads the budget-stop
function's markers (gcp.storage.get_bucket_objects) and leaves a held team's nodes out
until the next budget interval or an explicit lift."""

from __future__ import annotations

from datetime import datetime, timezone

from model.budget_hold import budget_hold
from model.pulumi_types import STORAGE_BUCKET, TPU_V2_VM
from ops.plan.mock_engine import GcpMocks, ProgramRun, run_program
from tests.infra.stack_fixtures import as_cli
from tests.infra.test_budget_stop_plan import stack
from tests.test_teams import problems_of

V2VM = TPU_V2_VM
NOW = datetime.now(timezone.utc)
START = NOW.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
MARKER = f"budget-stop/vision/b-1/{START:%Y-%m-%dT%H%M%SZ}/at-1.json"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def test_a_stop_holds_its_team_until_the_next_interval_or_a_lift() -> None:
    marker = "budget-stop/vision/b-1/2026-12-01T080000Z/at-1.json"
    hold = budget_hold("vision", [marker, "budget-stop/vision/junk"], at("2026-12-20T00:00"))
    assert hold is not None and (hold.interval, hold.marker) == ("2026-12", marker)
    assert hold.until == at("2027-01-01T08:00")
    assert budget_hold("vision", [marker], at("2027-01-01T08:00")) is None  # next interval
    assert budget_hold("vision", [marker], at("2026-12-01T07:59")) is None
    assert budget_hold("vision", [marker], at("2026-12-20T00:00"), lifted="2026-12") is None
    assert budget_hold("nlp", [marker], at("2026-12-20T00:00")) is None  # another team's


def planned(markers: list[str], **vision: object) -> ProgramRun:
    config = as_cli(stack(budgetAction="stop", **vision))
    artifacts = "acme-ml-test-test-artifacts"  # naming.bucket("artifacts")
    return run_program(config, "test", mock=GcpMocks(bucket_objects={artifacts: markers}))


def node_projects(run: ProgramRun) -> list[str]:
    return sorted(r.inputs["project"] for r in run.of_type(V2VM))


def test_a_held_teams_nodes_leave_the_program_with_a_warning_and_its_buckets_stay() -> None:
    free, held = planned([]), planned([MARKER])
    assert node_projects(free) == ["acme-ml-test-nlp", "acme-ml-test-vision"]
    assert node_projects(held) == ["acme-ml-test-nlp"]
    buckets = {r.inputs["name"] for r in held.of_type(STORAGE_BUCKET)}
    assert buckets == {r.inputs["name"] for r in free.of_type(STORAGE_BUCKET)}
    warnings = [m for level, m in held.logs if level == "warning" and "is held" in m]
    assert len(warnings) == 1 and "team vision" in warnings[0] and MARKER in warnings[0]
    assert "trainer" in warnings[0] and f"liftBudgetHold is '{START:%Y-%m}'" in warnings[0]
    hold = held.outputs["teams"]["vision"]["budgetHold"]
    assert hold["nodes"] == ["trainer"] and hold["interval"] == f"{START:%Y-%m}"
    assert held.outputs["teams"]["vision"]["nodes"] == {}


def test_lifting_the_hold_declares_the_nodes_again() -> None:
    run = planned([MARKER], liftBudgetHold=f"{START:%Y-%m}")
    assert node_projects(run) == ["acme-ml-test-nlp", "acme-ml-test-vision"]
    assert "budgetHold" not in run.outputs["teams"]["vision"]


def test_lift_budget_hold_names_a_month() -> None:
    assert problems_of(stack(budgetAction="stop", liftBudgetHold="december")) == [
        ("tpu-stack:teams.vision.liftBudgetHold",
         "'december' is not a budget interval: YYYY-MM, e.g. '2026-12'")]


def test_a_node_the_janitor_deleted_stays_out_until_its_settings_change() -> None:
    from model.budget_hold import janitor_marker
    from model.fleet import target_for
    from model.settings.load import load_settings

    config = stack(budgetAction="stop")
    stack_target = target_for(load_settings(as_cli(config), "test", None))  # what tpuctl reads
    trainer = next(n for n in stack_target.nodes if n.team == "vision")
    node_id = trainer.node_id
    marker = janitor_marker(node_id, trainer.settings_digest)
    artifacts = stack_target.artifacts_bucket
    assert artifacts == "acme-ml-test-test-artifacts"
    held = run_program(as_cli(config), "test", mock=GcpMocks(bucket_objects={artifacts: [marker]}))
    assert node_projects(held) == ["acme-ml-test-nlp"]
    warnings = [m for level, m in held.logs if level == "warning" and "janitor" in m]
    assert len(warnings) == 1 and node_id in warnings[0]
    assert held.outputs["teams"]["vision"]["nodes"] == {}
    config["tpu-stack:teams"]["vision"]["nodes"][0]["maxRuntime"] = "30h"  # a new decision
    again = run_program(as_cli(config), "test",
                        mock=GcpMocks(bucket_objects={artifacts: [marker]}))
    assert node_projects(again) == ["acme-ml-test-nlp", "acme-ml-test-vision"]


def test_the_offline_plan_shows_a_held_teams_nodes() -> None:
    from ops.plan.offline import offline_plan
    from ops.plan.report import spend_section

    marker = f"budget-stop/nlp/b-9/{START:%Y-%m-%dT%H%M%SZ}/at-1.json"
    plan = offline_plan("platform", bucket_objects={
        "acme-ml-shared-platform-artifacts": [marker]}).to_json()
    held = plan["spend"]["nlp"]["held"]
    assert held["nodes"] == ["pod", "sweep"] and held["interval"] == f"{START:%Y-%m}"
    assert "held" not in plan["spend"]["vision"]
    assert not [r for r in plan["resources"] if r["type"] == V2VM and "nlp" in r["name"]]
    assert f"- held: a budget stop in {START:%Y-%m} keeps pod, sweep out of this plan" in (
        spend_section(plan) or "")
