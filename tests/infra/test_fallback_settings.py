"""`fallback`, `maxWait`, `allowCostlier`: candidates and every refusal at once."""

from __future__ import annotations

import pytest

from model.settings.load import load_settings
from model.settings.schema import SettingsError
from tests.infra.stack_fixtures import as_cli, config, node

N0 = "tpu-stack:nodes[0]"


def load(*nodes: dict):
    return load_settings(as_cli(config(tpu_stack_nodes=list(nodes))), "test")


def problems(*nodes: dict) -> dict[str, str]:
    with pytest.raises(SettingsError) as caught:
        load(*nodes)
    return dict(caught.value.problems)


def test_candidates_take_what_an_entry_does_not_name_from_the_node() -> None:
    settings = load(node(provisioning="queued", queue={"spot": True}, maxWait="20s", fallback=[
        {"zone": "us-west4-a"},
        {"zone": "us-central1-a", "generation": "v5p", "topology": "2x2x1"},
        {"zone": "europe-west4-b", "provisioning": "spot"},
    ]))
    own, west, v5p, eu = settings.nodes[0].candidates

    assert (west.zone, west.tpu.accelerator_type, west.queue.spot) == (
        "us-west4-a", "v5litepod-8", True)
    assert (v5p.accelerator_type, v5p.tpu.accelerator_type) == (None, "v5p-8")
    assert (eu.provisioning, eu.queue) == ("spot", None)
    assert settings.nodes[0].max_wait_seconds == 20
    assert own is settings.nodes[0]
    # The network reaches every candidate's region.
    assert settings.regions == ["europe-west4", "us-central1", "us-west4"]


def test_every_refusal_at_once() -> None:
    found = problems(
        node(provisioning="spot", fallback=[
            {"zone": "us-east1-d"},                                   # v5e not offered there
            {"zone": "us-west4-a", "provisioning": "on-demand"},      # costlier
            {"zone": "us-central1-a"},                                # the node itself again
            {"zone": "us-west1-c", "provisioning": "preemptible"},    # no queued form
            {"zone": "us-south1-a"},
            {"zone": "us-south1-a"},                                  # duplicate
        ]),
        node(name="other", maxWait="30m"),                            # maxWait, no fallback
        node(name="third", maxWait="half an hour", fallback=[{"zone": "us-west4-a"}]),
    )

    assert "does not offer TPU v5e" in found[f"{N0}.fallback[0].zone"]
    assert "allowCostlier: true" in found[f"{N0}.fallback[1]"]
    assert "$" in found[f"{N0}.fallback[1]"]
    assert "the node's own placement" in found[f"{N0}.fallback[2].zone"]
    assert "use spot" in found[f"{N0}.fallback[3].provisioning"]
    assert "fallback[4]" in found[f"{N0}.fallback[5].zone"]
    assert "applies only with fallback" in found["tpu-stack:nodes[1].maxWait"]
    assert "is not a duration" in found["tpu-stack:nodes[2].maxWait"]


def test_allow_costlier_accepts_the_costlier_candidate() -> None:
    settings = load(node(provisioning="spot", allowCostlier=True,
                         fallback=[{"zone": "us-west4-a", "provisioning": "on-demand"}]))
    assert settings.nodes[0].candidates[1].provisioning == "on-demand"


def test_a_node_without_fallback_is_unchanged() -> None:
    settings = load(node())
    assert settings.nodes[0].candidates == [settings.nodes[0]]
    assert settings.regions == ["us-central1"]


def test_a_team_stacks_candidate_in_a_region_the_platform_has_no_subnet_in_is_refused() -> None:
    import copy
    import json

    from components.stack_config import file_config
    from components.team_stack import PlatformStackError
    from ops.plan.mock_engine import GcpMocks, planned_stack_outputs, run_program

    platform_ref = "acme/tpu-stack/platform"
    outputs = copy.deepcopy(planned_stack_outputs(platform_ref))
    raw = file_config("team-vision")
    nodes = json.loads(raw["tpu-stack:nodes"])
    nodes[0].update(fallback=[{"zone": "us-west4-a"}])
    raw["tpu-stack:nodes"] = json.dumps(nodes)
    assert "us-west4" not in outputs["network"]["subnets"]

    with pytest.raises(PlatformStackError) as caught:
        run_program(raw, "team-vision", mock=GcpMocks(stack_outputs={platform_ref: outputs}))

    assert (f"tpu-stack:nodes[0].fallback[0].zone: {platform_ref} has no subnet of team "
            f"vision in us-west4" in str(caught.value))


def test_a_misspelt_key_in_an_entry_is_one_problem() -> None:
    found = problems(node(fallback=[{"zon": "us-west4-a"}]))
    assert list(found) == [f"{N0}.fallback[0].zon"]
    assert "did you mean zone?" in found[f"{N0}.fallback[0].zon"]


def test_an_unreserved_candidate_of_a_committed_node_is_priced_without_the_commitment() -> None:
    settings = load(node(provisioning="queued", queue={"reservationName": "r1"},
                         commitment="1-year", allowCostlier=True,
                         fallback=[{"zone": "us-west4-a", "provisioning": "spot"}]))
    own, spot = settings.nodes[0].candidates
    assert (own.commitment, spot.commitment) == ("1-year", None)


# ---- team quota: a fallback node counts against every quota its candidates draw on ----

def test_a_team_node_counts_against_each_candidates_family_and_capacity() -> None:
    from tests.test_teams import platform, problems_of, spot, team

    costlier = spot(allowCostlier=True, fallback=[
        {"provisioning": "on-demand", "acceleratorType": "v5litepod-16"}])

    # The team's quota: v5e spot 16, on-demand 8; the candidate takes 16 on-demand.
    assert problems_of(platform(vision=team("vision", costlier))) == [(
        "tpu-stack:teams.vision.quota.v5e.onDemand",
        "team vision needs 16 v5e on-demand chips (nodes: trainer candidate 2/2 16); "
        "its quota is 8")]


def test_a_candidate_in_a_region_the_platform_holds_no_quota_in_is_refused() -> None:
    from tests.test_teams import platform, problems_of, spot, team

    elsewhere = spot(fallback=[{"zone": "europe-west4-b"}])

    assert problems_of(platform(vision=team("vision", elsewhere))) == [(
        "tpu-stack:quota.v5e.europe-west4.preemptible",
        "the teams need 8 v5e preemptible (spot and preemptible) chips in europe-west4 "
        "(vision 8); no v5e quota is declared in europe-west4")]


def test_a_node_counts_once_per_quota_however_many_candidates_share_it() -> None:
    from tests.test_teams import platform, spot, team

    # v5e-16 spot, else v5e-8 spot in the same zone: one quota (v5e preemptible in
    # us-central1; the team's spot 16). The node holds 16 there at most, not 24.
    same_quota = spot(acceleratorType="v5litepod-16",
                      fallback=[{"acceleratorType": "v5litepod-8"}])

    settings = load_settings(as_cli(platform(vision=team("vision", same_quota))), "test")

    assert [c.tpu.chips for c in settings.teams["vision"].nodes[0].candidates] == [16, 8]
