"""`provisioning: queued` in components/tpu_node.py declares a QueuedTpu (mock engine)."""

from __future__ import annotations

import node_agent as agent
from model.pulumi_types import COMPONENT_TPU_NODE, DYNAMIC_QUEUED_TPU, TPU_V2_VM
from tests.infra.test_components import node_run

QUEUED_TYPE = DYNAMIC_QUEUED_TPU


def test_a_queued_node_is_a_queued_tpu_with_the_agents_metadata() -> None:
    run, args = node_run(provisioning="queued", queue={"spot": True, "validUntilDuration": "6h"})

    assert run.of_type(TPU_V2_VM) == []
    (queued,) = run.of_type(QUEUED_TYPE)
    inputs = queued.inputs
    assert queued.delete_before_replace
    assert run.by_urn()[queued.parent].type == COMPONENT_TPU_NODE
    assert (inputs["node_id"], inputs["zone"]) == ("test-trainer", "us-central1-a")
    assert (inputs["spot"], inputs["guaranteed"], inputs["valid_until_seconds"]) == (
        True,
        False,
        21600,
    )
    assert inputs["accelerator_type"] == "v5litepod-8"
    assert inputs["service_account_email"] == args.service_account_email
    assert inputs["enable_external_ips"] is False
    assert inputs["metadata"][agent.STATUS_KEY] == "gs://l/status/test-trainer/"
    assert inputs["metadata"][agent.STARTUP_SCRIPT_KEY] == agent.startup_script()
    assert inputs["metadata"]["tpu-stack-node"] == "test-trainer"


def test_a_queued_topology_goes_as_an_accelerator_config() -> None:
    run, _ = node_run(
        provisioning="queued",
        queue={"guaranteed": True},
        acceleratorType=None,
        generation="v5e",
        topology="2x4",
    )

    (queued,) = run.of_type(QUEUED_TYPE)
    assert queued.inputs.get("accelerator_type") is None
    assert (queued.inputs["accelerator_config_type"], queued.inputs["accelerator_topology"]) == (
        "V5LITE_POD",
        "2x4",
    )
