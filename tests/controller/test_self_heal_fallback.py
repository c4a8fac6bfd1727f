"""The GitHub self-heal schedule is the fallback of stacks without a controller
(.github/stacks.py has_controller: `heal` answers false for the others)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.test_workflows import stacks


def stack_file(root: Path, stack: str, config: dict) -> None:
    (root / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))


def test_a_stack_or_a_team_stack_whose_platform_runs_the_controller_is_not_healed_by_ci(
        tmp_path: Path) -> None:
    stack_file(tmp_path, "platform", {"tpu-stack:controller": {"enabled": True}})
    stack_file(tmp_path, "team-vision", {"tpu-stack:platformStack": "acme/tpu-stack/platform",
                                         "tpu-stack:team": "vision"})
    stack_file(tmp_path, "dev", {"tpu-stack:controller": {"enabled": False}})

    assert stacks.has_controller("platform", tmp_path)
    assert stacks.has_controller("team-vision", tmp_path)
    assert not stacks.has_controller("dev", tmp_path)
    assert not stacks.has_controller("missing", tmp_path)
