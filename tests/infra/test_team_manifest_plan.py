"""A team stack hands the platform's controller its desired state (issue 43): while the
platform runs a controller (its outputs object for the team names the controller's
account), the team stack's program writes its manifest into its own artifacts bucket and
grants that account read on the manifest and on its agents' status objects only; the
platform's manifest names where each team's manifest is. Pulumi's mock engine."""

from __future__ import annotations

import copy
import json

import pytest

from components.stack_config import file_config
from model import team_state
from model.manifest import parse
from ops.plan.mock_engine import GcpMocks, ProgramRun, planned_stack_outputs, run_program
from policy.iam import IamModel
from tests.test_teams import PLATFORM_REF

OBJECT = "gcp:storage/bucketObject:BucketObject"
CONTROLLER = "platform-controller@acme-ml-shared.iam.gserviceaccount.com"
MANIFEST = "controller/manifests/team-vision.json"
TEAM_ARTIFACTS = "acme-ml-shared-team-vision-vision-artifacts"
TEAM_LOGS = "acme-ml-shared-team-vision-vision-logs"


def team_vision(controller: str | None) -> ProgramRun:
    outputs = copy.deepcopy(planned_stack_outputs(PLATFORM_REF))
    outputs.pop("controller", None)
    if controller is not None:
        outputs["controller"] = {"serviceAccount": controller}
    return run_program(file_config("team-vision"), "team-vision",
                       mock=GcpMocks(stack_outputs={PLATFORM_REF: outputs}))


@pytest.fixture(scope="module")
def with_controller() -> ProgramRun:
    return team_vision(CONTROLLER)


def manifests(run: ProgramRun) -> list:
    return [r for r in run.of_type(OBJECT) if r.inputs.get("name", "").startswith(
        "controller/manifests/")]


def test_the_team_stack_writes_its_manifest_with_its_nodes_into_its_own_bucket(
        with_controller: ProgramRun) -> None:
    [manifest] = manifests(with_controller)
    parsed = parse(manifest.inputs["content"])

    assert (manifest.inputs["bucket"], manifest.inputs["name"]) == (TEAM_ARTIFACTS, MANIFEST)
    assert parsed.target.stack == "team-vision"
    assert sorted(n.node_id for n in parsed.target.nodes) == [
        "team-vision-vision-eval", "team-vision-vision-trainer"]
    assert {(n.team, n.project) for n in parsed.target.nodes} == {
        ("vision", "acme-ml-shared-vision")}
    assert parsed.status_buckets == (TEAM_LOGS,)  # trainer has an idleStop


def test_the_controller_may_read_the_manifest_and_the_status_objects_only(
        with_controller: ProgramRun) -> None:
    model = IamModel.of(with_controller.registrations)
    member = f"serviceAccount:{CONTROLLER}"
    artifacts = f"projects/_/buckets/{TEAM_ARTIFACTS}/objects"
    logs = f"projects/_/buckets/{TEAM_LOGS}/objects"

    assert model.can(member, "storage.objects.get", f"{artifacts}/{MANIFEST}")
    assert not model.can(member, "storage.objects.get", f"{artifacts}/packages/x.tar.gz")
    assert not model.can(member, "storage.objects.create", f"{artifacts}/{MANIFEST}")
    assert model.can(member, "storage.objects.get",
                     f"{logs}/status/team-vision-vision-trainer/worker-0/status.json")
    assert not model.can(member, "storage.objects.get", f"{logs}/tb/x/events")


def test_without_a_controller_on_the_platform_nothing_is_declared() -> None:
    run = team_vision(None)

    assert manifests(run) == []
    assert not [r for r in run.registrations if CONTROLLER in str(r.inputs)]


def test_the_platform_names_each_teams_manifest_where_the_team_stack_writes_it() -> None:
    config = dict(file_config("platform"))
    config["tpu-stack:controller"] = json.dumps({"enabled": True, "interval": "5m"})
    run = run_program(config, "platform")
    [manifest] = [r for r in manifests(run)
                  if r.inputs["name"] == "controller/manifests/platform.json"]
    refs = {r.team: r for r in parse(manifest.inputs["content"]).team_manifests}
    [vision_outputs] = [r for r in run.of_type(OBJECT) if r.inputs.get("name") ==
                        team_state.outputs_object("platform", "vision")]

    assert (refs["vision"].bucket, refs["vision"].object) == (TEAM_ARTIFACTS, MANIFEST)
    assert (refs["vision"].stack, refs["vision"].project) == (
        "team-vision", "acme-ml-shared-vision")
    assert set(refs) == {"vision"}  # nlp deploys no team stack (no `ci`): nothing to read
    assert json.loads(vision_outputs.inputs["content"])["controller"] == {
        "serviceAccount": CONTROLLER}
    # nlp's nodes (idleStop) publish to nlp's logs bucket: named, and readable by it.
    nlp_logs = "acme-ml-shared-platform-nlp-logs"
    assert nlp_logs in parse(manifest.inputs["content"]).status_buckets
    assert IamModel.of(run.registrations).can(
        f"serviceAccount:{CONTROLLER}", "storage.objects.get",
        f"projects/_/buckets/{nlp_logs}/objects/status/platform-nlp-sweep/worker-0/status.json")
