"""Node settings maxRuntime and idleStop (issue 36): checked, and carried to the node's
metadata in whole seconds (node_agent/contract.py), where the agent reads them."""

from __future__ import annotations

from model.pulumi_types import TPU_V2_VM
from model.settings.load import load_settings
from node_agent.contract import IDLE_STOP_KEY, MAX_RUNTIME_KEY, STOP_REQUEST_KEY
from ops.plan.mock_engine import run_program
from tests.infra.stack_fixtures import as_cli, config, node
from tests.test_teams import problems_of


def test_limits_reach_the_nodes_metadata_in_seconds() -> None:
    data = config(tpu_stack_nodes=[node(maxRuntime="12h", idleStop="30m"),
                                   node(name="free")])
    run = run_program(as_cli(data), "dev")
    vms = {r.inputs["name"]: r for r in run.of_type(TPU_V2_VM)}
    limited = next(r for name, r in vms.items() if not name.endswith("free"))
    assert limited.inputs["metadata"][MAX_RUNTIME_KEY] == "43200"
    assert limited.inputs["metadata"][IDLE_STOP_KEY] == "1800"
    free = next(r for name, r in vms.items() if name.endswith("free"))
    assert MAX_RUNTIME_KEY not in free.inputs["metadata"]
    assert IDLE_STOP_KEY not in free.inputs["metadata"]
    # A stop request someone sets on the node is not the stack's to take back.
    assert f'metadata["{STOP_REQUEST_KEY}"]' in limited.ignore_changes
    settings = load_settings(as_cli(data), "dev")
    assert settings.nodes[0].max_runtime_seconds == 43200


def test_bad_limits_name_their_key_and_what_is_allowed() -> None:
    data = config(tpu_stack_nodes=[node(maxRuntime="forever", idleStop="30s")])
    assert problems_of(data) == [
        ("tpu-stack:nodes[0].maxRuntime", "'forever' is not a duration: a number and s, m, h "
                                          "or d (e.g. 30m, 12h, 7d)"),
        ("tpu-stack:nodes[0].idleStop", "30s is under a minute: use 1m or more")]
