"""A misspelt zone or region gets a "did you mean", as a misspelt storage location and key
do; a real name that lacks the TPU gets none (it is no typo)."""

from __future__ import annotations

import pytest

from model.settings.load import load_settings
from model.settings.schema import SettingsError
from tests.infra.stack_fixtures import as_cli, config, node


def problems_of(data: dict) -> dict[str, str]:
    with pytest.raises(SettingsError) as caught:
        load_settings(as_cli(config(**data)), "test")
    return dict(caught.value.problems)


def test_a_misspelt_zone_names_the_zone_meant() -> None:
    problems = problems_of({"tpu_stack_nodes": [node(zone="us-centrl1-a")]})
    message = problems["tpu-stack:nodes[0].zone"]
    assert message.startswith("us-centrl1-a does not offer TPU v5e; did you mean us-central1-a? (")


def test_a_real_zone_without_the_generation_is_not_taken_for_a_typo() -> None:
    problems = problems_of({"tpu_stack_nodes": [node(zone="us-central2-b")]})
    message = problems["tpu-stack:nodes[0].zone"]
    assert message.startswith("us-central2-b does not offer TPU v5e (")
    assert "did you mean" not in message


def test_a_misspelt_subnet_region_names_the_region_meant() -> None:
    problems = problems_of({"tpu_stack_network": {"subnets": {"us-cenral1": "10.0.0.0/20"}}})
    assert problems["tpu-stack:network.subnets.us-cenral1"].startswith(
        "'us-cenral1' is not a region with TPUs; did you mean us-central1? (")


def test_a_misspelt_quota_region_names_the_region_meant() -> None:
    problems = problems_of({"tpu_stack_quota": {"v5e": {"us-centrl1": {"spot": 8}}}})
    assert problems["tpu-stack:quota.v5e.us-centrl1"].startswith(
        "v5e is not offered in us-centrl1; did you mean us-central1? (regions: ")
