"""Committed-use prices beside on-demand and spot, and a node that runs under a commitment."""

from __future__ import annotations

import pytest

from model import catalog, cost
from model.settings.load import load_settings
from model.settings.schema import SettingsError
from ops.plan.offline import cost_json
from ops.plan.report import cost_summary, node_prices
from tests.infra.stack_fixtures import as_cli, config, node

N0 = "tpu-stack:nodes[0]"
V6E = catalog.GENERATIONS["v6e"].price


def settings(**node_changes: object):
    return load_settings(as_cli(config(tpu_stack_nodes=[node(**node_changes)])), "test")


def problems(**node_changes: object) -> dict[str, str]:
    with pytest.raises(SettingsError) as caught:
        settings(**node_changes)
    return dict(caught.value.problems)


def test_the_catalog_has_committed_prices_with_their_source():
    assert (V6E.on_demand, V6E.one_year, V6E.three_year) == (2.70, 1.89, 1.22)
    assert V6E.committed_confirmed and "Trillium GA" in V6E.committed_source
    for name in ("v4", "v5e", "v5p"):
        price = catalog.GENERATIONS[name].price
        assert price.one_year < price.on_demand and price.three_year < price.one_year
        assert not price.committed_confirmed  # recalled, marked unconfirmed
    v6e_8 = catalog.parse_accelerator_type("v6e-8")
    assert catalog.usd_per_hour(v6e_8, spot=False, commitment="3-year") == 8 * 1.22
    assert catalog.usd_per_hour(catalog.parse_accelerator_type("v2-8"), spot=False,
                                commitment="1-year") is None  # no price: n/a, not a guess


def test_a_reserved_node_can_run_under_a_commitment_and_is_priced_at_it():
    stack = settings(acceleratorType="v6e-8", zone="us-east1-d", provisioning="reserved",
                     commitment="1-year")
    [trainer] = cost.settings_cost(stack).nodes
    assert trainer.commitment == "1-year" and trainer.usd_per_hour == pytest.approx(8 * 1.89)
    assert trainer.by_rate == pytest.approx({"onDemand": 8 * 2.70, "spot": 8 * 1.78,
                                             "oneYear": 8 * 1.89, "threeYear": 8 * 1.22})
    assert "committed use: Google's Trillium GA announcement" in trainer.price_source


@pytest.mark.parametrize("provisioning", ["spot", "preemptible", "on-demand"])
def test_a_commitment_needs_reserved_capacity(provisioning: str):
    found = problems(provisioning=provisioning, commitment="3-year")
    assert found[f"{N0}.commitment"].startswith(
        f"3-year applies to reserved capacity only (a future reservation with a committed "
        f"use discount, cloud.google.com/tpu/docs/long-term-reservation); this node is "
        f"{provisioning}")


def test_an_unknown_commitment_is_named_with_what_is_allowed():
    found = problems(provisioning="reserved", commitment="5-year")
    assert "1-year" in found[f"{N0}.commitment"] and "3-year" in found[f"{N0}.commitment"]


def test_the_estimate_shows_every_rate_side_by_side():
    stack = settings(acceleratorType="v6e-8", zone="us-east1-d", provisioning="reserved",
                     commitment="3-year")
    plan = {"cost": cost_json(cost.settings_cost(stack)), "resources": []}
    assert plan["cost"]["byRate"] == pytest.approx(
        {"onDemand": 21.6, "spot": 14.24, "oneYear": 15.12, "threeYear": 9.76})
    summary = cost_summary(plan)
    assert summary.startswith("Estimated cost: $9.76/hour")
    assert ("- the same nodes at each rate: on-demand $21.60/hour, spot $14.24/hour, "
            "1-year commitment $15.12/hour, 3-year commitment $9.76/hour") in summary
    # v5e's committed prices are unconfirmed: marked ~ like any unconfirmed price.
    v5e = settings(provisioning="reserved")  # the fixture's v5litepod-8
    line = cost_summary({"cost": cost_json(cost.settings_cost(v5e))}).splitlines()
    assert ("- the same nodes at each rate: on-demand $9.60/hour, spot $4.86/hour, "
            "1-year commitment ~$6.72/hour, 3-year commitment ~$4.32/hour") in line


def test_the_node_row_says_it_runs_under_a_commitment():
    row_cost = {"name": "trainer", "usdPerHour": 9.76, "reserved": True, "commitment": "3-year"}
    assert node_prices(row_cost) == ("$9.76 via reservation (3-year commitment)",
                                     "$7,124.80 via reservation (3-year commitment)")
