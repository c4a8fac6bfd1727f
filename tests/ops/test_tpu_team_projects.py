"""tpuctl on a platform stack: each team's nodes live in the team's own project
(docs/teams.md), so every list, read and change goes to the node's project."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from components.stack_config import file_config
from model.fleet import StackTarget, target_for
from model.settings.load import load_settings
from ops.tpu import status
from ops.tpu.actions import apply_actions, recovery_plan
from ops.tpu.api import TpuApi
from ops.tpu.preflight import preflight
from tests.fakes.tpu_api import FakeTpuApi, running

LABELS = {"stack": "platform", "managed-by": "pulumi"}
NLP, VISION = "acme-ml-shared-nlp", "acme-ml-shared-vision"
VISION_NODE = {"name": "trainer", "zone": "us-central1-a", "acceleratorType": "v5litepod-8",
               "provisioning": "spot", "job": "sweep"}


def platform_with_two_teams() -> StackTarget:
    """Pulumi.platform.yaml (nlp declares two nodes) with one node for vision too."""
    config = file_config("platform")
    teams = json.loads(config["tpu-stack:teams"])
    teams["vision"]["nodes"] = [VISION_NODE]
    teams["vision"]["jobs"] = {"sweep": teams["nlp"]["jobs"]["sweep"]}
    config["tpu-stack:teams"] = json.dumps(teams)
    return target_for(load_settings(config, "platform"))


@pytest.fixture
def two_projects(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeTpuApi, FakeTpuApi]]:
    zones = ["us-central1-a", "us-central2-b"]
    nlp = FakeTpuApi(NLP, accelerator_types={z: ["v4-32", "v5litepod-8"] for z in zones},
                     runtime_versions={z: ["tpu-vm-tf-2.18.0-pjrt", "tpu-vm-tf-2.18.0-pod-pjrt",
                                           "v2-alpha-tpuv5-lite"] for z in zones})
    vision = nlp.add_project(VISION)
    with running(nlp):
        monkeypatch.setenv("TPU_STACK_TPU_ENDPOINT", nlp.endpoint)
        yield nlp, vision


def test_team_nodes_are_in_their_teams_projects() -> None:
    target = platform_with_two_teams()

    assert {(n.logical, n.project) for n in target.nodes} == {
        ("pod", NLP), ("sweep", NLP), ("trainer", VISION)}
    assert target.projects == [NLP, VISION]
    assert target.places == [(NLP, "us-central1-a"), (NLP, "us-central2-b"),
                             (VISION, "us-central1-a")]
    assert target.project == "acme-ml-shared", "the stack's own project stays gcp:project"


def test_status_lists_and_reads_each_node_in_its_project(
    two_projects: tuple[FakeTpuApi, FakeTpuApi],
) -> None:
    nlp, vision = two_projects
    target = platform_with_two_teams()
    ids = {n.logical: n.node_id for n in target.nodes}
    nlp.add_node("us-central1-a", ids["sweep"], labels=LABELS, accelerator_type="v5litepod-8")
    nlp.add_node("us-central2-b", ids["pod"], "PREEMPTED", labels=LABELS,
                 accelerator_type="v4-32")
    vision.add_node("us-central1-a", ids["trainer"], labels=LABELS,
                    accelerator_type="v5litepod-8")
    vision.set_guest_attributes("us-central1-a", ids["trainer"], 0, {"state": "running"})
    api = TpuApi(deadline=10.0)

    nodes = api.with_job_status(api.stack_nodes(target.places, target.stack))

    assert sorted((n.project, n.node_id, n.job.get("state", "")) for n in nodes) == [
        (NLP, ids["pod"], ""), (NLP, ids["sweep"], ""), (VISION, ids["trainer"], "running")]
    assert status.absent(target, nodes) == []
    assert [(c.action, c.zone) for c in vision.calls] == [
        ("list", "us-central1-a"), ("getGuestAttributes", "us-central1-a")]

    apply_actions(api, recovery_plan(nodes))

    assert nlp.node("us-central2-b", ids["pod"]) is None, "deleted in nlp's project"
    assert [c.action for c in vision.mutating_calls()] == []


def test_preflight_asks_each_project_for_its_zones_offers(
    two_projects: tuple[FakeTpuApi, FakeTpuApi],
) -> None:
    nlp, vision = two_projects
    seen: list[tuple[str, str]] = []

    def quota(project: str, region: str, _gen: object, _spot: bool) -> int:
        seen.append((project, region))
        return 1000

    preflight(platform_with_two_teams(), TpuApi(deadline=10.0), quota)

    assert {c.zone for c in vision.calls} == {"us-central1-a"}
    assert {c.zone for c in nlp.calls} == {"us-central1-a", "us-central2-b"}
    assert sorted(set(seen)) == [(NLP, "us-central1"), (NLP, "us-central2"),
                                 (VISION, "us-central1")]


def test_a_project_the_fake_does_not_serve_is_refused(
    two_projects: tuple[FakeTpuApi, FakeTpuApi],
) -> None:
    from ops.tpu.api import TpuApiError

    with pytest.raises(TpuApiError, match="in project acme-ml-shared-other needs"):
        TpuApi(deadline=10.0).list_nodes("acme-ml-shared-other", "us-central1-a")
