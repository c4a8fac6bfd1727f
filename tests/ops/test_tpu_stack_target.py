"""ops/tpu/target.py: every stack file in the repo resolves to node ids and slices."""

from __future__ import annotations

import pytest

from model.fleet import TargetError
from ops.tpu.target import load_target
from tests.repo_stacks import repo_stacks


@pytest.mark.parametrize("stack", repo_stacks())
def test_every_stack_file_resolves(stack: str) -> None:
    target = load_target(stack)

    assert target.stack == stack and target.nodes
    for node in target.nodes:
        assert node.node_id.startswith(f"{stack}-")
        assert node.zone in target.zones
        assert node.tpu.chips > 0


def test_an_unknown_stack_is_one_clear_error() -> None:
    with pytest.raises(TargetError, match=r"no stack file Pulumi\.nosuch\.yaml"):
        load_target("nosuch")
