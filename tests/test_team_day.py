"""A team's first day (issue 45): a new team and its own stack touch no other team, and
the plan says what a person needs first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.stack_config import file_config
from ops.plan.diff import diff_plans
from ops.plan.offline import PlanError, offline_plan
from ops.plan.report import plain

SPEECH_JOB = {"model": "mnist_cnn", "trainData": "datasets/mnist/train-*.tfrecord",
              "globalBatchSize": 256, "trainSteps": 100, "stepsPerExecution": 10,
              "checkpointEverySteps": 50}
OTHER_TEAMS = ("vision", "nlp")


def with_speech(config: dict[str, str]) -> dict[str, str]:
    """The shipped platform with team speech, whose BERT-sized node falls back into two
    regions no other team uses, and the platform's v5e quota there."""
    config = dict(config)
    teams = json.loads(config["tpu-stack:teams"])
    teams["speech"] = {
        "subnetSlot": 2, "members": ["group:ml-speech@acme.example"],
        "quota": {"v5e": {"spot": 16}}, "labels": {"cost-centre": "cc-speech"},
        "nodes": [{"name": "bert", "zone": "us-central1-a", "acceleratorType": "v5litepod-8",
                   "provisioning": "spot", "job": "bert",
                   "fallback": [{"zone": "us-west4-a"}, {"zone": "us-south1-a"}]}],
        "jobs": {"bert": SPEECH_JOB}}
    config["tpu-stack:teams"] = json.dumps(teams)
    quota = json.loads(config["tpu-stack:quota"])
    quota["v5e"].update({"us-west4": {"preemptible": 16}, "us-south1": {"preemptible": 16}})
    config["tpu-stack:quota"] = json.dumps(quota)
    return config


def belongs_to(step_resource: dict[str, Any], team: str) -> bool:
    """Whether a plan resource is one of `team`'s (its logical name or component says so)."""
    words = f"{step_resource['name']} {step_resource.get('component') or ''}"
    return any(f"{team}-" in part or part.endswith(f"-{team}") or part.endswith(team)
               for part in words.replace(":", " ").split())


@pytest.fixture(scope="module")
def speech_diff() -> Any:
    config = file_config("platform")
    base = plain(offline_plan("platform", config).to_json())
    head = plain(offline_plan("platform", with_speech(config)).to_json())
    return diff_plans(base, head)


def test_a_team_falling_back_into_new_regions_changes_no_other_team(speech_diff) -> None:
    moved = [s for s in speech_diff.steps.steps if s.op != "same"]
    touched = [(s.op, s.name) for s in moved for team in OTHER_TEAMS
               if belongs_to(dict(s.resource), team)]
    assert touched == []
    assert not speech_diff.removed and not speech_diff.replacements
    # Not speech's: the platform's own subnets in the two new regions and its
    # internal rule over them.
    others = sorted((s.op, s.name) for s in moved if not belongs_to(dict(s.resource), "speech"))
    assert others == [("create", "subnet-us-south1"), ("create", "subnet-us-west4"),
                      ("update", "allow-internal")]
    created = {s.name for s in speech_diff.steps.of("create")}
    for region in ("us-central1", "us-west4", "us-south1"):
        assert f"speech-subnet-{region}" in created
        assert f"speech-quota-v5e-preemptible-{region}" in created
    # speech uses no v4 region: no subnet nor cap of its own in us-central2.
    assert not [name for name in created if name.startswith("speech") and "us-central2" in name]


def test_a_team_stack_fallback_outside_its_regions_is_refused_with_the_key_to_set() -> None:
    config = file_config("team-vision")
    nodes = json.loads(config["tpu-stack:nodes"])
    nodes[0]["fallback"] = [{"zone": "us-west4-a"}]
    config["tpu-stack:nodes"] = json.dumps(nodes)
    with pytest.raises(PlanError) as refused:
        offline_plan("team-vision", config)
    message = str(refused.value)
    assert "tpu-stack:nodes[0].fallback[0].zone" in message
    assert ("set tpu-stack:teams.vision.regions: [us-central1, us-west4] in the platform "
            "stack") in message


# ---- locality: every node a team runs, every candidate -----------------------------

def test_a_team_stack_candidate_in_another_region_than_its_data_is_warned_of() -> None:
    from components.stack_config import settings_for
    from model.locality import stack_warnings
    from model.settings.load import load_settings
    from ops.plan.platform_facts import data_location

    config = file_config("team-vision")
    nodes = json.loads(config["tpu-stack:nodes"])
    nodes[0]["fallback"] = [{"zone": "us-west4-a"}]
    config["tpu-stack:nodes"] = json.dumps(nodes)
    settings = load_settings(config, "team-vision")
    # The platform's data bucket is in the platform's storage location.
    assert data_location(settings) == settings_for("platform").storage.location
    (warning,) = stack_warnings(settings, data_location(settings))
    assert warning.startswith(
        "node trainer: its fallback candidate 2/2 in us-west4-a reads trainData from "
        "gs://acme-ml-shared-platform-data (us-central1) and writes checkpoints to "
        "gs://acme-ml-shared-team-vision-vision-checkpoints (us-central1), outside its "
        "region us-west4: ")
    assert "~$20/TB moved (unconfirmed, model/catalog.py;" in warning


# ---- headroom offline from the team's cap ---------------------------------------------

def test_a_platform_team_node_s_candidates_show_headroom_from_the_team_cap(speech_diff) -> None:
    rows = speech_diff.head["candidates"]["bert"]
    # speech: 16 v5e spot chips, the platform grants v5e in each region: its cap there.
    assert [(r["zone"], r["quotaHeadroom"]) for r in rows] == [
        ("us-central1-a", "<=16"), ("us-west4-a", "<=16"), ("us-south1-a", "<=16")]


def test_a_team_stack_node_s_candidates_show_headroom_from_the_team_cap() -> None:
    config = file_config("team-vision")
    nodes = json.loads(config["tpu-stack:nodes"])
    nodes[0]["fallback"] = [{"acceleratorType": "v5litepod-4"},
                            {"acceleratorType": "v5litepod-4", "provisioning": "on-demand"}]
    config["tpu-stack:nodes"] = json.dumps(nodes)
    rows = plain(offline_plan("team-vision", config).to_json())["candidates"]["trainer"]
    # vision's cap (Pulumi.platform.yaml): v5e spot 64, on-demand 16; its eval node
    # takes 4 on-demand chips.
    assert [r["quotaHeadroom"] for r in rows] == ["<=64", "<=64", "<=12"]


def test_preflight_checks_every_candidate_s_zone_in_the_catalog() -> None:
    from model.settings.load import load_settings
    from ops.tpu.preflight import candidate_catalog_checks, placements
    from ops.tpu.target import target_for

    settings = load_settings(with_speech(file_config("platform")), "platform")
    (bert,) = [n for n in target_for(settings).nodes if n.logical == "bert"]
    assert [(zone, wanted) for _, zone, wanted, _ in placements(bert)] == [
        ("us-central1-a", "v5litepod-8"), ("us-west4-a", "v5litepod-8"),
        ("us-south1-a", "v5litepod-8")]
    checks = candidate_catalog_checks(bert)
    assert [(c.subject, c.what, c.outcome) for c in checks] == [
        ("platform-speech-bert candidate 2/3", "catalog: v5e in us-west4-a", "ok"),
        ("platform-speech-bert candidate 3/3", "catalog: v5e in us-south1-a", "ok")]


def test_the_team_plan_shows_its_budget_and_cap_usage() -> None:
    plan = plain(offline_plan("team-vision").to_json())
    assert plan["teamCaps"]["vision"]["caps"] == [
        {"family": "v5e", "capacity": "onDemand", "used": 4, "cap": 16},
        {"family": "v5e", "capacity": "spot", "used": 8, "cap": 64}]
    assert plan["teamCaps"]["vision"]["usdPerHourCeiling"] == 60.0
