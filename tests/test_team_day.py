"""A team's first day (issue 45): a new team and its own stack touch no other team, and
the plan says what a person needs first."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

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
        "alerts": {"email": "ml-speech@acme.example"},
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
    # Not speech's: the platform's own subnets in the two new regions, its internal rule
    # over them, and the controller's manifest, which lists speech's node.
    others = sorted((s.op, s.name) for s in moved if not belongs_to(dict(s.resource), "speech"))
    assert others == [("create", "subnet-us-south1"), ("create", "subnet-us-west4"),
                      ("update", "allow-internal"), ("update", "controller-manifest")]
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
    from model.fleet import target_for
    from model.settings.load import load_settings
    from ops.tpu.preflight import candidate_catalog_checks, placements

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


# ---- a plan a person reads in one screen ----------------------------------------------

@pytest.fixture(scope="module")
def platform_screen() -> list[str]:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-m", "ops.cli", "plan", "--stack", "platform"],
                          cwd=root, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_platform_plan_at_100_columns_leads_with_its_summary(platform_screen) -> None:
    assert "Summary" in platform_screen[:40]
    summary_at = platform_screen.index("Summary")
    assert platform_screen[summary_at + 1].startswith("- ")
    assert "resources (pulumi preview's count)" in platform_screen[summary_at + 1]
    too_long = [line for line in platform_screen if len(line) > 100]
    assert too_long == []
    assert any(line.startswith("Resources by team and component") for line in platform_screen)


def test_each_warning_appears_once(platform_screen) -> None:
    text = "\n".join(platform_screen)
    plan = plain(offline_plan("platform").to_json())
    assert plan["warnings"] and len(plan["warnings"]) == len(set(plan["warnings"]))
    assert text.count("TPU quota id(s) are unconfirmed") == 1
    assert text.count("Warnings (") == 1
    assert "never at this rate" not in text


# ---- the smaller items ------------------------------------------------------------------

def settings_problems(config: dict[str, str], stack: str) -> list[tuple[str, str]]:
    from model.settings.load import load_settings
    from model.settings.schema import SettingsError

    with pytest.raises(SettingsError) as refused:
        load_settings(config, stack)
    return refused.value.problems


def edited(stack: str, key: str, edit: Any) -> dict[str, str]:
    config = file_config(stack)
    value = json.loads(config[key])
    edit(value)
    config[key] = json.dumps(value)
    return config


def test_reserved_on_a_team_node_with_fallback_is_one_error() -> None:
    def reserved(nodes: list) -> None:
        nodes[0].update(provisioning="reserved", fallback=[{"acceleratorType": "v5litepod-4"}])
    problems = settings_problems(edited("team-vision", "tpu-stack:nodes", reserved),
                                 "team-vision")
    assert [key for key, _ in problems] == ["tpu-stack:nodes[0].provisioning"]


def test_a_misspelt_key_has_no_knock_on_error() -> None:
    def misspelt(nodes: list) -> None:
        nodes[0].update(fallbacks=[{"zone": "us-west4-a"}], maxWait="10m")
    problems = settings_problems(edited("team-vision", "tpu-stack:nodes", misspelt),
                                 "team-vision")
    assert [key for key, _ in problems] == ["tpu-stack:nodes[0].fallbacks"]
    assert "did you mean fallback?" in problems[0][1]


@pytest.mark.parametrize(("key", "edit", "where"), [
    ("tpu-stack:quota", lambda q: q.update(v5litepod={"us-central1": {"onDemand": 8}}),
     "tpu-stack:quota.v5litepod"),
    ("tpu-stack:teams", lambda t: t["vision"]["quota"].update(v5litepod={"spot": 8}),
     "tpu-stack:teams.vision.quota.v5litepod"),
])
def test_a_family_written_as_its_type_prefix_suggests_the_family(key, edit, where) -> None:
    (problem,) = settings_problems(edited("platform", key, edit), "platform")
    assert problem[0] == where and "did you mean v5e?" in problem[1]


def test_a_taken_subnet_slot_suggests_a_free_one() -> None:
    (problem,) = settings_problems(
        edited("platform", "tpu-stack:teams", lambda t: t["nlp"].update(subnetSlot=0)),
        "platform")
    assert problem == ("tpu-stack:teams.vision.subnetSlot",
                       "0 is team nlp's: each team has a slot of its own; slot 1 is free "
                       "(subnetSlot: 1)")


def test_a_misspelt_team_lists_the_platform_s_teams() -> None:
    from model.settings.schema import SettingsError

    config = file_config("team-vision")
    config["tpu-stack:team"] = "visoin"
    with pytest.raises(SettingsError) as refused:
        offline_plan("team-vision", config)
    assert refused.value.problems == [(
        "tpu-stack:team", "'visoin' is not a team of acme/tpu-stack/platform (its "
                          "tpu-stack:teams: nlp, vision); did you mean vision?")]


def test_a_misspelt_team_region_is_refused_with_the_regions() -> None:
    problems = settings_problems(
        edited("platform", "tpu-stack:teams", lambda t: t["vision"].update(
            regions=["us-centrl1"])), "platform")
    assert problems[0][0] == "tpu-stack:teams.vision.regions[0]"
    assert "did you mean us-central1?" in problems[0][1]


# ---- docs/teams.md's checklist, followed from a copy of the repository ------------------

CHECKLIST_STEP = re.compile(
    r"<!-- checklist: (?P<file>\S+)(?: (?P<path>\S+))? -->\s*\n(?P<indent>[ ]*)```yaml\n"
    r"(?P<body>.*?)\n(?P=indent)```", re.DOTALL)


def checklist_steps(doc: str) -> list[tuple[str, str | None, Any]]:
    """(file, key path under which to merge, YAML) of each checklist step of the doc."""
    steps = []
    for match in CHECKLIST_STEP.finditer(doc):
        body = textwrap.dedent("\n".join(
            line.removeprefix(match["indent"]) for line in match["body"].splitlines()))
        steps.append((match["file"], match["path"], yaml.safe_load(body)))
    return steps


def apply_step(root: Path, file: str, path: str | None, value: Any) -> None:
    target = root / file
    if path is None:
        assert not target.exists(), f"the checklist creates {file}, which exists"
        target.write_text(yaml.safe_dump(value, sort_keys=False))
        return
    data = yaml.safe_load(target.read_text())
    node = data
    for key in path.split("."):
        node = node[key]
    assert isinstance(node, dict) and not set(node) & set(value), (file, path)
    node.update(value)
    target.write_text(yaml.safe_dump(data, sort_keys=False))


def repository_copy(destination: Path) -> Path:
    root = Path(__file__).resolve().parents[1]
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = root / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def test_the_add_a_team_checklist_ends_in_clean_plans(tmp_path: Path) -> None:
    root = repository_copy(tmp_path / "repo")
    steps = checklist_steps((root / "docs" / "teams.md").read_text())
    assert [(file, path) for file, path, _ in steps] == [
        ("Pulumi.platform.yaml", "config.tpu-stack:teams"),
        ("Pulumi.platform.yaml", "config.tpu-stack:quota.v5e"),
        ("Pulumi.team-speech.yaml", None)]
    for file, path, value in steps:
        apply_step(root, file, path, value)
    env = {**os.environ, "COLUMNS": "100"}
    for stack in ("platform", "team-speech"):
        done = subprocess.run([sys.executable, "-m", "ops.cli", "plan", "--stack", stack],
                              cwd=root, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (stack, done.stdout[-2000:], done.stderr[-2000:])
        text = " ".join(done.stdout.split())  # lines wrapped at COLUMNS joined
        assert "may apply every resource" in text, stack
        assert "Policy pack: every guardrail passes." in text, stack
    # The team plan's one warning: its us-west4 candidate is across regions from its data.
    assert "its fallback candidate 2/2 in us-west4-a reads trainData" in text


def test_a_team_stack_whose_proof_did_not_run_says_so_as_a_warning(monkeypatch) -> None:
    from ops.commands.plan import proof_text
    from ops.plan.proof import Proof

    monkeypatch.setenv("COLUMNS", "200")  # one line: the width of the machine's terminal aside

    unproved = Proof(None, why_unproved="the platform declares no deployer for team speech "
                                        "(tpu-stack:teams.speech.ci)")
    assert proof_text(unproved, None, None).startswith(
        "WARNING: permission proof: not run (the platform declares no deployer for team "
        "speech")
    assert "WARNING" not in proof_text(Proof("serviceAccount:x@y"), "markdown", None)
