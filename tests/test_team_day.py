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
