"""The pack's config files: known policies and settings, loaded as the engine reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.pulumi_types import SERVICEACCOUNT_KEY
from policy.evaluate import CONFIG_PATH, evaluate, load_config
from policy.tpu_policies import CONFIG_SCHEMAS, POLICIES

EXAMPLE = CONFIG_PATH.parent / "config.example.json"
NAMES = {policy.name for policy in POLICIES}


@pytest.mark.parametrize("path", [CONFIG_PATH, EXAMPLE], ids=["config", "example"])
def test_config_files_name_real_policies_and_settings(path: Path):
    for name, value in load_config(path).items():
        assert name in NAMES | {"all"}, name
        settings = set(value) - {"enforcementLevel"}
        assert settings <= set(CONFIG_SCHEMAS.get(name, {})), (name, settings)


@pytest.mark.parametrize("path", [CONFIG_PATH, EXAMPLE], ids=["config", "example"])
def test_config_values_have_the_schema_types(path: Path):
    python_types = {"array": list, "object": dict, "string": str}
    for name, value in load_config(path).items():
        for key, setting in value.items():
            if key != "enforcementLevel":
                schema_type = CONFIG_SCHEMAS[name][key]["type"]
                assert isinstance(setting, python_types[schema_type]), (name, key)


def test_policy_names_are_unique_and_every_policy_is_mandatory():
    assert len(NAMES) == len(POLICIES) == 14
    levels = {p.name: p.enforcement_level.value for p in POLICIES}
    assert levels.pop("tpu-team-node-limits") == "advisory"  # a warning (issue 36)
    assert set(levels.values()) == {"mandatory"}


def test_all_disabled_turns_every_policy_off(tmp_path):
    plan = {"resources": [{"urn": "urn:pulumi:prod::tpu-stack::gcp:serviceaccount/key:Key::k",
                           "type": SERVICEACCOUNT_KEY, "name": "k", "inputs": {}}]}
    assert [v.policy for v in evaluate(plan)] == ["no-service-account-keys"]
    (tmp_path / "off.json").write_text(json.dumps({"all": "disabled"}))
    assert evaluate(plan, load_config(tmp_path / "off.json")) == []


def test_bad_config_is_one_clear_error(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"tpu-spot-stacks": "sometimes"}))
    with pytest.raises(ValueError, match="or an enforcement level \\(advisory, mandatory"):
        load_config(tmp_path / "bad.json")


def test_a_copy_of_the_dev_stack_under_another_name_passes_the_pack_as_dev_does(tmp_path):
    """Pulumi.t12.yaml, a copy of Pulumi.dev.yaml, as a new user would try it."""
    from components.stack_config import file_config
    from model.archive import REPO_ROOT
    from ops.plan.offline import offline_plan
    from policy.evaluate import evaluate, load_config

    for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
        target = "Pulumi.t12.yaml" if name == "Pulumi.dev.yaml" else name
        (tmp_path / target).write_text((REPO_ROOT / name).read_text())
    plan = offline_plan("t12", file_config("t12", tmp_path)).to_json()
    assert plan["environment"] == "dev"
    assert evaluate(plan, load_config()) == []
    prod_like = {**plan, "environment": "prod"}
    assert {v.policy for v in evaluate(prod_like, load_config())} == {
        "tpu-spot-stacks", "protected-data-buckets"}
